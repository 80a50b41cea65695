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
    rows = {r[0]: r for r in table(d, "compaction_task")["rows"]}
    assert set(rows) >= {"truncation", "recursive summary (by the model)"}
    for name, r in rows.items():
        if "ceiling" in name:
            continue
        in_context, recoverable, lost = r[1:4]
        assert in_context + recoverable + lost == facts
        assert r[8] <= 256 - 32  # the compacted context stays within the prompt budget
        assert r[9] >= 1  # the history did not fit: it was compacted
    # truncation brings nothing back: a question's prompt holds exactly what the context held
    trunc = rows["truncation"]
    assert trunc[4] == trunc[1]
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
    retrieval = table(d, "retrieval_depth_retrieval")["rows"]
    assert [r[0] for r in retrieval] == [1, 2] and {r[1] for r in retrieval} == {20}
    # the top 2 hold the top 1: recall and retrieved tokens cannot fall with k
    assert retrieval[1][2] >= retrieval[0][2] and retrieval[1][4] > retrieval[0][4] > 0
    task = table(d, "retrieval_depth_task")["rows"]
    assert [r[0] for r in task] == [
        "hybrid@1",
        "hybrid@2",
        "gold passages only (the model's ceiling)",
    ]
    assert {r[1] for r in task} == {4}
    cost = table(d, "retrieval_depth_cost")["rows"]
    # answered after k = 1, the k = 2 prompts find the first passage in the prefix cache
    assert cost[1][4] > cost[0][4]
    assert cost[1][3] > cost[0][3]  # more tokens, higher hosted price
    numbers = {r["name"]: r["tokens"] for r in results["context_numbers"]}
    assert (
        numbers["retrieved tokens"] == round(retrieval[-1][4]) == d["figures"]["retrieved_tokens"]
    )
    base, seen = obs(d, "recall_at_k_pct")
    assert (base, seen) == (retrieval[0][2], retrieval[1][2])


def test_the_answered_subset_is_seeded_and_in_order() -> None:
    from ctxlab.workshop.demo_retrieval_depth import subset

    items = list(range(100))
    picked = subset(items, 16, 0)
    assert picked == subset(items, 16, 0) == sorted(picked) and len(set(picked)) == 16
    assert picked != subset(items, 16, 1)
    assert subset(items, 100, 3) == items
