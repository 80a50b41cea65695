"""Demonstration 11 (long context against retrieval): its records and verdicts without the
model, and its rows read from the shared tiny run (`tiny_run`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.workshop.demo_long_vs_retrieval import (
    Answer,
    Measured,
    Row,
    Slice,
    Write,
    _same,
    _shared_prefix,
    against,
    compare,
    label,
    not_isolated,
    organisations,
    points,
    priced,
    said,
)


def answer(i: int, correct: bool, usd: float, **more: object) -> Answer:
    a = Answer(f"q{i}", "x" if correct else "y", correct, 1.0, None, 0.0, 300, 320, 16, 4,
               100.0, 1.0, usd, None)  # fmt: skip
    return replace(a, **more)  # type: ignore[arg-type]


def row(k: int | None, correct: list[bool], usd: float, kind: str = "retrieval", **more) -> Row:
    """A row of `correct` answers to q0, q1, ... at `usd` each; `more` sets a field of each."""
    answers = tuple(answer(i, c, usd, **more) for i, c in enumerate(correct))
    return Row(kind, k if kind == "retrieval" else None, answers)  # type: ignore[arg-type]


def with_fields(r: Row, **per_answer: list) -> Row:
    """`r` with the named fields of its answers set, one value per answer."""
    n = len(r.answers)
    answers = tuple(
        replace(a, **{f: v[i] for f, v in per_answer.items()})
        for i, a in zip(range(n), r.answers, strict=True)
    )
    return replace(r, answers=answers)


def verdict(r: Row, warm: Row) -> str:
    return said(compare(0, r, warm), r).removeprefix("long context wins: ")


def wins(r: Row, warm: Row) -> bool:
    return compare(0, r, warm).wins


def test_the_slice_is_whole_organisations_in_the_fixtures_order() -> None:
    from ctxlab.rag import corpus_fixture

    fx = corpus_fixture(0)
    groups = organisations(fx)
    assert len(groups) == 24
    assert all(g[0].startswith("profile-") for g in groups)
    # half the organisations have a second version and a news item repeating the old one
    assert sum(len(g) == 2 for g in groups) == 12
    assert {d for g in groups for d in g} == {d.doc_id for d in fx.docs}
    # every gold question is about an organisation's profile
    assert {q.doc_id for q in fx.questions} <= {g[0] for g in groups}


def test_the_whole_corpus_wins_by_answers_or_by_price_within_noise() -> None:
    warm = row(None, [True] * 12, 0.001, "warm")
    worse = row(1, [False] * 12, 0.0005)
    assert points(against(worse, warm)).low > 0
    assert wins(worse, warm)
    assert verdict(worse, warm) == "whole corpus answers better beyond noise; cheaper: bm25@1"
    same_dearer = row(2, [True] * 12, 0.002)
    assert wins(same_dearer, warm)
    assert verdict(same_dearer, warm) == "answers within noise; cheaper: whole corpus (warm)"
    same_cheaper = row(4, [True] * 12, 0.0005)
    assert not wins(same_cheaper, warm)
    better = row(8, [True] * 12, 0.002)
    loses = row(None, [False] * 12, 0.001, "warm")
    assert not wins(better, loses)  # cheaper, but it answers worse beyond noise
    assert verdict(better, loses).startswith("bm25@8 answers better beyond noise")


def test_pairs_follow_the_question_ids() -> None:
    warm = row(None, [True, False, True], 0.001, "warm")
    cold = row(None, [False], 0.002, "cold", question_id="q2")
    # the cold row asked only q2: paired with warm's q2 (right)
    assert points(against(cold, warm)).value == pytest.approx(100.0)
    assert _same(with_fields(cold, text=["x"]), warm) == 1
    assert _same(with_fields(cold, text=["z"]), warm) == 0
    assert [label(r) for r in (row(4, [True], 0.0), cold, warm)] == [
        "bm25@4", "whole corpus, cold", "whole corpus, warm"
    ]  # fmt: skip


def test_the_warm_row_reads_its_prefix_and_writes_it_once() -> None:
    from ctxlab.plan.rate_card import load_rate_card

    card = load_rate_card("default")  # per million: input 2.00, cache read 0.20, output 12.00
    warm = row(None, [True, True], 0.0, "warm", output_tokens=10)
    warm = with_fields(warm, prompt_tokens=[1000, 1010])
    cold = row(None, [True, True], 0.0, "cold", output_tokens=10)
    cold = with_fields(cold, prompt_tokens=[1000, 1010])
    write = 2.00 * 990 / 1e6 / 2  # 990 shared tokens written once (at the input rate), over 2
    out = 12.00 * 10 / 1e6
    assert priced(warm, card, 990) == pytest.approx(
        [2.00 * 10 / 1e6 + 0.20 * 990 / 1e6 + out + write,
         2.00 * 20 / 1e6 + 0.20 * 990 / 1e6 + out + write]
    )  # fmt: skip
    assert priced(cold, card, 990) == pytest.approx([2.00e-3 + out, 2.00 * 1010 / 1e6 + out])


def test_a_cold_row_served_from_the_cache_is_not_cold() -> None:
    from ctxlab.workshop.result import Figures

    cold = row(None, [True, False], 0.0, "cold", reused_tokens=0)
    cold = with_fields(cold, prompt_tokens=[370, 372])
    assert not_isolated(cold, Figures()) is None
    # a server that ignores cache_salt (llama.cpp's slots)
    cold = with_fields(cold, reused_tokens=[0, 369])
    f = Figures()
    why = not_isolated(cold, f)
    assert why is not None and "369 of the cold requests' 742 prompt tokens" in why
    assert f.values == {"cold_reused_tokens": 369, "cold_prompt_tokens": 742}


def test_shared_prefix() -> None:
    assert _shared_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert _shared_prefix([[7, 8], [7, 8]]) == 2


def test_a_slice_past_the_window_is_one_sentence(tmp_path: Path) -> None:
    from ctxlab.workshop.config_file import load_config

    bad = tmp_path / "long.toml"
    bad.write_text("[long_vs_retrieval]\ncontext_tokens = 5000\n")
    with pytest.raises(
        CtxlabError, match=r"long_vs_retrieval\.context_tokens .* needs 5076 tokens"
    ):
        load_config(bad)
    bad.write_text("[long_vs_retrieval]\ncold_questions = 99\n")
    with pytest.raises(CtxlabError, match="cold_questions 99"):
        load_config(bad)
    # a 6K slice fits a 6,400 window, but not beside a cold copy in the default 8,192 pool
    bad.write_text("[model]\nmax_model_len = 6400\n[long_vs_retrieval]\ncontext_tokens = 6000\n")
    with pytest.raises(CtxlabError, match="needs 12152 tokens of pool, more than engine"):
        load_config(bad)
    bad.write_text("[long_vs_retrieval]\nfixture_organisations = 25\n")
    with pytest.raises(CtxlabError, match="fixture_organisations must be even"):
        load_config(bad)


# -- the tiny run ---------------------------------------------------------------------------
def _tables(tiny_run) -> dict[str, dict]:
    results, _ = tiny_run
    d = results["demos"]["long_vs_retrieval"]
    assert d["status"] == "run", d["status"]
    return {t["key"]: t for t in d["tables"]}


def _rows(table: dict) -> dict[str, dict[str, object]]:
    names = [c["name"] for c in table["columns"]]
    return {r[0]: dict(zip(names, r, strict=True)) for r in table["rows"]}


@pytest.mark.model
def test_rows_are_each_k_then_the_whole_corpus_cold_and_warm(tiny_run) -> None:
    t = _tables(tiny_run)
    task = _rows(t["long_vs_retrieval_task"])
    assert list(task) == ["bm25@1", "whole corpus, cold", "whole corpus, warm"]
    for name, r in task.items():
        assert r["95 % interval low"] <= r["accuracy %"] <= r["95 % interval high"]
        assert r["questions answered"] == (1 if "cold" in name else 2)
    # the whole slice holds every evidence sentence: measured, not assumed
    assert task["whole corpus, warm"]["evidence in the prompt %"] == pytest.approx(100.0)
    assert task["whole corpus, warm"]["whole corpus (warm) minus this row, points"] is None
    serving = _rows(t["long_vs_retrieval_serving"])
    warm, cold = serving["whole corpus, warm"], serving["whole corpus, cold"]
    assert cold["reused tokens per answer"] == 0  # a fresh salt: nothing reused
    # the corpus prefix is read from the cache: all but the question's own page or two
    assert warm["reused tokens per answer"] >= warm["prompt tokens per answer"] - 64
    assert serving["bm25@1"]["reused tokens per answer"] < warm["reused tokens per answer"]
    for r in serving.values():
        assert r["TTFT 95 % low ms"] <= r["TTFT median ms"] <= r["TTFT 95 % high ms"]
        assert r["CPU s per answer"] > 0


@pytest.mark.model
def test_costs_and_the_verdict_column(tiny_run) -> None:
    cost = _rows(_tables(tiny_run)["long_vs_retrieval_cost"])
    per = "hosted USD per 1,000 answers"
    warm, cold = cost["whole corpus, warm"], cost["whole corpus, cold"]
    assert warm[per] < cold[per]  # the cache read is priced below uncached input
    # the tiny run names no rate card: the shipped dated card is priced beside it
    dated = "hosted USD per 1,000 answers, dated card"
    assert 0 < warm[dated] < cold[dated]
    assert all(r["self-hosted USD per 1,000 answers (CPU time)"] > 0 for r in cost.values())
    assert warm["x whole corpus (warm)"] == pytest.approx(1.0)
    assert cost["bm25@1"]["context tokens per question"] < warm["context tokens per question"]
    said = str(cost["bm25@1"]["whole corpus (warm) against this row"])
    assert said.removeprefix("long context wins: ").split(";")[0] in (
        "whole corpus answers better beyond noise",
        "bm25@1 answers better beyond noise",
        "answers within noise",
    )


def _measured(warm_reused: int, cold_reused: int) -> Measured:
    rows = []
    for kind, reused in (("retrieval", 16), ("cold", cold_reused), ("warm", warm_reused)):
        n = 1 if kind == "cold" else 4
        rows.append(row(1, [True, False, True, False][:n], 0.001, kind, reused_tokens=reused))
    facts = Slice(1, 24, 2, 5, 300, 310, 4)
    return Measured(tuple(rows), facts, Write(100.0, 1.0), 46080, False, 0.1, True)


@pytest.mark.parametrize(("warm_reused", "cold_reused"), [(304, 0), (32, 0), (304, 300)])
def test_the_report_says_when_a_side_was_not_what_it_is_called(warm_reused, cold_reused) -> None:
    from types import SimpleNamespace

    from ctxlab.workshop.demo_long_vs_retrieval import DEMO, explain, verdicts
    from ctxlab.workshop.result import DemoResult

    res = DemoResult.of(DEMO)
    session = SimpleNamespace(cfg=SimpleNamespace(cost=SimpleNamespace(currency="USD")))
    m = _measured(warm_reused, cold_reused)
    explain(session, res, m, verdicts(DemoResult.of(DEMO), m))  # type: ignore[arg-type]
    notes = " ".join(res.notes)
    assert ("The warm row was not warm" in notes) == (warm_reused < 155)
    assert ("The cold row was not cold" in notes) == (cold_reused > 0)
    cold_gain = res.gains[0]
    assert (cold_gain.storage is None) == (cold_reused > 0)  # no case where nothing was cold


def test_the_plot_is_drawn_from_the_records(tmp_path: Path) -> None:
    from ctxlab.workshop.demo_long_vs_retrieval import DEMO, draw

    m = _measured(304, 0)
    path = draw(m, "USD", DEMO.plot("11_long_vs_retrieval.png").path(tmp_path))
    assert path == tmp_path / "plots" / "11_long_vs_retrieval.png"
    assert path.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.model
def test_the_run_draws_its_declared_plot(tiny_run) -> None:
    results, out = tiny_run
    (plot,) = results["demos"]["long_vs_retrieval"]["plots"]
    assert plot == "plots/11_long_vs_retrieval.png"
    assert (out / plot).read_bytes()[:4] == b"\x89PNG"
