"""Demonstrations 10 and 11 keep the records rule (`plain_records`): `measure` returns
frozen records of tuples, numbers, bools and `Literal`s, a string only where the run or the
fixture produced it; run at tiny sizes (test_measure_records.py reads every registered
demonstration's return type)."""

from __future__ import annotations

import pytest
from plain_records import FOLLOWUP_TEXTS, LONG_TEXTS, problems, type_problems

from ctxlab.progress import progress


def _measure(module, session):
    with progress("measure", enabled=False) as tracker:
        return module.measure(session, tracker)


def test_a_formatted_label_in_a_row_would_be_found() -> None:
    """The rule's teeth on these records: a row named by a string fails it."""
    from dataclasses import dataclass

    from ctxlab.workshop.followup_records import Row

    @dataclass(frozen=True)
    class Named(Row):
        setting: str = "snapkv@0.25"

    row = Named("full", None, None, None, (True,), (), (1,), (1,), (), (), (), 0, None, None)
    assert any("setting" in p for p in problems(row, FOLLOWUP_TEXTS))
    assert any("setting" in p for p in type_problems(Named, FOLLOWUP_TEXTS))


@pytest.mark.model
def test_followup_measures_frozen_records(session) -> None:
    from ctxlab.workshop import demo_followup as demo
    from ctxlab.workshop.followup_report import label

    m = _measure(demo, session)
    assert problems(m, FOLLOWUP_TEXTS) == []
    c = demo.DEMO.config(session.cfg)
    names = [label(r, c) for r in m.rows]
    assert names == ["full cache", "fresh prefill per question", "snapkv@0.5", "streaming@0.5"] + [
        label(s, c) for s, _, _ in demo.settings(c)[2:]
    ]
    assert names[-1].startswith("recall(snapkv)@")
    for r in m.rows:  # 2 documents, 2 facts: one follow-up each
        assert len(r.q1) == 2 and len(r.follow) == 2
        assert len(r.resident_q1) == 2
    assert [len(d.facts) for d in m.docs] == [2, 2]
    assert len(m.fresh_ttft_ms) == 2 and m.main == 0.5


@pytest.mark.model
def test_long_vs_retrieval_measures_frozen_records(session) -> None:
    from ctxlab.workshop import demo_long_vs_retrieval as demo

    m = _measure(demo, session)
    assert problems(m, LONG_TEXTS) == []
    assert [demo.label(r) for r in m.rows] == [
        "bm25@1", "whole corpus, cold", "whole corpus, warm"
    ]  # fmt: skip
    retrieval, cold, warm = m.rows
    assert len(warm.answers) == len(retrieval.answers) == 2 and len(cold.answers) == 1
    assert cold.questions == warm.questions[:1]  # the same question, asked cold
    assert m.dated  # the tiny config names no rate card: the dated card is priced beside it
    assert all(a.usd > 0 and a.usd_dated is not None for r in m.rows for a in r.answers)
    assert not m.through_server and all(a.cpu_s is not None for a in warm.answers)


class _Refusing:
    """A server's request backend that refuses every request, as a server whose window is
    shorter than the whole-corpus prompt does (HTTP 400 in one sentence)."""

    label = "`a server`"

    def generator(self) -> _Refusing:
        return self

    def generate(self, prompts, params=None, cache_salt=None):
        from ctxlab.errors import CtxlabError

        raise CtxlabError(
            "http://h refused a probe request (HTTP 400: this model's maximum context length "
            "is 256 tokens, but 470 were requested)."
        )

    def slot_bytes(self, generator) -> int:
        return 1


@pytest.mark.model
def test_a_server_that_cannot_answer_long_vs_retrieval_makes_it_not_measurable(session) -> None:
    from ctxlab.workshop import demo_long_vs_retrieval as demo

    session.requests = _Refusing()
    with progress("run", enabled=False) as tracker:
        res = demo.run(session, tracker)
    assert res.status == "not measurable"
    assert "maximum context length is 256 tokens" in res.summary
    assert "long_vs_retrieval.context_tokens (400)" in res.summary
    session.requests.label = ""  # the local engine never refuses: a refusal is one sentence
    with progress("run", enabled=False) as tracker, pytest.raises(Exception) as err:
        demo.run(session, tracker)
    from ctxlab.errors import CtxlabError

    assert err.type is CtxlabError and str(err.value).startswith("long_vs_retrieval: http://h")
