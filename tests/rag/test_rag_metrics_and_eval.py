"""RAG metrics on a hand-made run, the seeded corpus, and `evaluate` end to end (fake model)."""

from __future__ import annotations

import json

import pytest
from memory_fakes import WordBackend

from ctxlab.errors import CtxlabError
from ctxlab.memory.scoring import answer_match, normalize
from ctxlab.rag.corpus import corpus_fixture
from ctxlab.rag.evaluate import EvalOptions, evaluate, evidence_chunks, ingest_fixture
from ctxlab.rag.metrics import citation_precision, citation_recall, recall_at_k, reciprocal_rank
from ctxlab.rag.report import EvalReport, RetrievalRow, TaskRow, verdict


def test_metrics_on_a_hand_made_run():
    evidence = [{"a#1", "a#2"}, {"a#5"}]  # two evidence sentences, the first in two chunks
    ranked = ["b#0", "a#2", "c#3", "a#5"]
    assert recall_at_k(ranked, evidence, 1) == 0.0
    assert recall_at_k(ranked, evidence, 2) == 0.5
    assert recall_at_k(ranked, evidence, 4) == 1.0
    assert reciprocal_rank(ranked, evidence) == 0.5
    assert reciprocal_rank(["x#0"], evidence) == 0.0
    assert citation_precision(["a#1", "b#0"], evidence) == 0.5
    assert citation_precision([], evidence) is None
    assert citation_recall(["a#1", "b#0"], evidence) == 0.5
    assert citation_recall(["a#2", "a#5"], evidence) == 1.0
    assert citation_recall([], evidence) == 0.0


def test_answer_match_is_normalized_whole_words():
    assert answer_match("It was founded by Ossa  Marrow.", ["ossa marrow"])
    assert answer_match("The answer: 1887!", ["1887"])
    assert not answer_match("code 44170", ["4417"])
    assert normalize("The Ünïcode, an Apple!") == "ünïcode apple"


def test_verdict_names_the_bigger_gap():
    report = EvalReport(settings={})
    report.retrieval.append(RetrievalRow("hybrid", 2, 0.9, 0.8, 10))
    report.task += [
        TaskRow("hybrid@2", 10, 0.5, None, 0.0, 0.0, {}),
        TaskRow("gold passages", 10, 0.6, None, 0.0, 0.0, {}),
    ]
    assert verdict(report, 2, "hybrid").startswith("the model, not retrieval,")
    report.task[1] = TaskRow("gold passages", 10, 0.95, None, 0.0, 0.0, {})
    assert verdict(report, 2, "hybrid").startswith("retrieval is the main limit")


def test_corpus_is_seeded_versioned_and_conflicting():
    a, b = corpus_fixture(1), corpus_fixture(1)
    assert a.docs == b.docs and a.questions == b.questions
    assert corpus_fixture(2).docs != a.docs
    assert len(a.questions) == 100 and len({q.id for q in a.questions}) == 100
    kinds = {q.kind for q in a.questions[:20]}
    assert len(kinds) >= 4  # any prefix is a mixed sample
    by_id: dict[str, list] = {}
    for d in a.docs:
        by_id.setdefault(d.doc_id, []).append(d)
    for q in a.questions:
        newest = max(by_id[q.doc_id], key=lambda d: d.date)
        for sentence in q.evidence:
            assert sentence in newest.text
        assert q.answer in " ".join(q.evidence)
        if q.note.startswith("versioned"):
            oldest = min(by_id[q.doc_id], key=lambda d: d.date)
            assert q.answer not in oldest.text  # v1 holds the old value
            news = by_id[q.doc_id.replace("profile-", "news-") + "-2021"][0]
            assert q.answer not in news.text  # and the news item conflicts
    assert sum(q.note.startswith("versioned") for q in a.questions) >= 12


def test_split_evidence_lands_in_different_chunks(store, real_backend):
    fixture = ingest_fixture(store, real_backend, None, seed=0)
    split = [q for q in fixture.questions if q.kind == "birthplace"]
    assert split
    for q in split:
        first, second = evidence_chunks(store, q)
        assert not first & second


def test_evaluate_end_to_end_with_a_fake_model(tmp_path):
    def answer(chat):
        text = chat[-1]["content"]
        return text.split("\n\n")[1] if "\n\n" in text else "I do not know."

    backend = WordBackend(window=4096, answer=answer)
    report = evaluate(
        backend, tmp_path / "e.db", ks=(1, 4), limit=12, cost_samples=1, show_progress=False
    )
    assert [(r.retriever, r.k) for r in report.retrieval] == [
        (r, k) for r in ("bm25", "dense", "hybrid") for k in (1, 4)
    ]
    for r1, r4 in zip(report.retrieval[0::2], report.retrieval[1::2], strict=True):
        assert 0 <= r1.recall <= r4.recall <= 1  # recall@k grows with k
        assert 0 <= r1.mrr <= r4.mrr <= 1
    assert [t.setting for t in report.task] == ["bm25@2", "gold passages"]  # the default
    gold = report.task[1]
    assert gold.citation_precision == 1.0  # the echoed first passage is a gold chunk
    assert [c.k for c in report.cost] == [1, 4]
    assert report.cost[0].prompt_tokens < report.cost[1].prompt_tokens
    assert report.cost[0].prefill_s is None  # the fake cannot time a prefill
    assert report.cost[1].dollars_per_1k_questions > report.cost[0].dollars_per_1k_questions
    assert report.settings["questions"] == 12 and report.verdict
    doc = report.as_dict()
    assert {"retrieval", "task", "cost", "verdict", "per_question", "comparisons"} <= set(doc)
    for t in report.task:  # every proportion with its count and a Wilson interval
        assert t.accuracy == t.correct / t.questions
        assert t.accuracy_low <= t.accuracy <= t.accuracy_high
    assert gold.citing_answers > 0
    assert [(c.retriever, c.k) for c in report.comparisons] == [
        (r, k) for r in ("dense", "hybrid") for k in (1, 4)
    ]
    json.dumps(doc, allow_nan=False)  # no NaN in results: missing intervals are null
    from ctxlab.rag.plot import plot_eval

    assert plot_eval(report, tmp_path / "eval.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    "bad",
    [
        {"ks": (0,)},
        {"retrievers": ("sparse",)},
        {"answer_k": 0},
        {"order": "shuffle"},
        {"limit": 0},
        {"chunk_tokens": 4},
    ],
)
def test_bad_options_are_one_sentence(bad):
    with pytest.raises(CtxlabError):
        EvalOptions(**bad).check()


def test_a_named_corpus_on_disk_gives_the_same_retrieval(tmp_path):
    from ctxlab.rag.evaluate import named_corpus

    docs = corpus_fixture(0).write(tmp_path / "fx")
    corpus = named_corpus([docs], tmp_path / "fx" / "questions.jsonl")
    backend = WordBackend(window=4096)
    opts = {"ks": (2,), "retrievers": ("bm25",), "answers": False, "limit": 30}
    from_disk = evaluate(backend, None, corpus=corpus, show_progress=False, **opts)
    seeded = evaluate(backend, None, show_progress=False, **opts)
    assert from_disk.retrieval == seeded.retrieval
    assert from_disk.settings["documents"] == 48
