"""Demonstrations 5 (compaction) and 6 (retrieval depth k) on the default model at tiny
sizes, read from the shared tiny run (`tiny_run` in conftest.py)."""

from __future__ import annotations

import pytest

from tests.workshop.test_run import demo, obs


def table(d: dict, key: str) -> dict:
    return next(t for t in d["tables"] if t["key"] == key)


@pytest.mark.model
def test_compaction_classifies_every_fact_under_every_strategy(tiny_run) -> None:
    d = demo(tiny_run, "compaction")
    facts = d["figures"]["facts"]
    assert facts == 3
    task = table(d, "compaction_task")
    col = {c["name"]: i for i, c in enumerate(task["columns"])}
    rows = {r[0]: r for r in task["rows"]}
    compact = "compaction (summary replaces the history, log deleted)"
    assert set(rows) >= {"truncation", "recursive summary (by the model)", compact}
    for name, r in rows.items():
        if "ceiling" in name:
            continue
        in_context, recoverable, lost = r[1:4]
        assert in_context + recoverable + lost == facts
        assert r[col["kept %"]] == pytest.approx(100 * (in_context + recoverable) / facts)
        assert r[col["kept 95 % low"]] <= r[col["kept %"]] <= r[col["kept 95 % high"]]
        assert r[col["tokens after"]] <= 256 - 32  # the compacted context fits the budget
        assert r[col["compactions"]] >= 1  # the history did not fit: it was compacted
    # truncation brings nothing back: a question's prompt holds exactly what the context held
    trunc = rows["truncation"]
    assert trunc[col["in the prompt when asked"]] == trunc[1]
    # compaction deletes what it evicts: nothing is recoverable by search, the rest is lost
    assert rows[compact][2] == 0
    notes = " ".join(d["notes"])
    assert f"cannot be reconstructed under {compact}" in notes
    per_fact = table(d, "compaction_facts")["rows"]
    assert len(per_fact) == facts
    base, seen = obs(d, "facts_lost")
    assert base == trunc[3] and seen == rows["tiered memory (recall archive)"][3]


@pytest.mark.model
def test_compaction_cost_counts_the_summarizer(tiny_run) -> None:
    d = demo(tiny_run, "compaction")
    cost = {r[0]: r for r in table(d, "compaction_cost")["rows"]}
    assert cost["truncation"][2] == 0 and cost["tiered memory (recall archive)"][2] == 0
    summary = cost["recursive summary (by the model)"]
    assert summary[2] >= 1 and summary[3] > 0 and summary[4] > 0  # calls, tokens in and out
    assert {t["layer"] for t in d["tables"]} == {"task", "cost"}


@pytest.mark.model
def test_retrieval_depth_keeps_retrieval_task_and_cost_apart(tiny_run) -> None:
    results, _ = tiny_run
    d = demo(tiny_run, "retrieval_depth")
    layers = {t["key"]: t["layer"] for t in d["tables"]}
    assert layers == {
        "retrieval_depth_retrieval": "retrieval",
        "retrieval_depth_task": "task",
        "retrieval_depth_cost": "cost",
    }
    retrieval_table = table(d, "retrieval_depth_retrieval")
    col = {c["name"]: i for i, c in enumerate(retrieval_table["columns"])}
    retrieval = retrieval_table["rows"]
    recall, tokens = col["recall@k %"], col["retrieved tokens per question"]
    assert [r[0] for r in retrieval] == [1, 2] and {r[1] for r in retrieval} == {20}
    # the top 2 hold the top 1: recall and retrieved tokens cannot fall with k
    assert retrieval[1][recall] >= retrieval[0][recall]
    assert retrieval[1][tokens] > retrieval[0][tokens] > 0
    for r in retrieval:  # every recall with its 95 % interval
        assert r[col["95 % interval low"]] <= r[recall] <= r[col["95 % interval high"]]
    task_table = table(d, "retrieval_depth_task")
    tcol = {c["name"]: i for i, c in enumerate(task_table["columns"])}
    task = task_table["rows"]
    assert [r[0] for r in task] == [
        "bm25@1",
        "bm25@2",
        "gold passages only (the model's ceiling)",
    ]
    assert {r[1] for r in task} == {4}
    for r in task:
        assert r[tcol["accuracy %"]] == pytest.approx(100 * r[tcol["answers right"]] / 4)
        low, high = r[tcol["95 % interval low"]], r[tcol["95 % interval high"]]
        assert low <= r[tcol["accuracy %"]] <= high and high - low > 20  # 4 questions: wide
    cost = table(d, "retrieval_depth_cost")["rows"]
    # answered after k = 1, the k = 2 prompts find the first passage in the prefix cache
    assert cost[1][4] > cost[0][4]
    assert cost[1][3] > cost[0][3]  # more tokens, higher hosted price
    numbers = {r["name"]: r["tokens"] for r in results["context_numbers"]}
    assert (
        numbers["retrieved tokens"]
        == round(retrieval[-1][tokens])
        == d["figures"]["retrieved_tokens"]
    )
    base, seen = obs(d, "recall_at_k_pct")
    assert (base, seen) == (retrieval[0][recall], retrieval[1][recall])
    accuracy = d["observations"]["answer_accuracy_pct"]
    assert accuracy["samples"] == 4 and accuracy["change_low"] <= accuracy["change_high"]
    gains = " ".join(g["product"] or "" for g in d["gains"])
    assert "beyond noise" in gains  # a best k is claimed only against the paired interval


def test_the_answered_subset_is_seeded_and_in_order() -> None:
    from ctxlab.workshop.demo_retrieval_depth import subset

    items = list(range(100))
    picked = subset(items, 16, 0)
    assert picked == subset(items, 16, 0) == sorted(picked) and len(set(picked)) == 16
    assert picked != subset(items, 16, 1)
    assert subset(items, 100, 3) == items
