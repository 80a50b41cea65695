"""Retrieval on two corpora: the seeded fixture and real prose (Coriolanus), so the default
retriever is not chosen on one generated fixture alone."""

from __future__ import annotations

import pytest

from ctxlab.rag.evaluate import evaluate
from ctxlab.rag.prose import QUESTIONS, prose_corpus
from ctxlab.rag.retriever import DEFAULT_RETRIEVER


def test_the_prose_corpus_is_well_formed():
    corpus = prose_corpus()
    assert len(corpus.questions) == len(QUESTIONS) == 32
    assert len({q.id for q in corpus.questions}) == 32
    texts = {d.doc_id: d.text for d in corpus.docs}
    assert len(texts) == len(corpus.docs) > 10
    for q in corpus.questions:
        assert q.doc_id in texts and q.answer and q.evidence


@pytest.mark.parametrize("corpus_name", ["fixture", "coriolanus"])
def test_the_default_retriever_is_never_beaten_beyond_noise(real_backend, corpus_name):
    """Every other retriever's paired change in recall@k against the default has an interval
    that reaches zero or lies below it, at every k, on both corpora."""
    corpus = prose_corpus() if corpus_name == "coriolanus" else None
    report = evaluate(
        real_backend,
        corpus=corpus,
        answers=False,
        retrievers=("bm25", "dense", "hybrid"),
        ks=(1, 2, 4, 8),
        show_progress=False,
    )
    assert {c.baseline for c in report.comparisons} == {DEFAULT_RETRIEVER}
    assert len(report.comparisons) == 2 * 4
    for c in report.comparisons:
        assert c.low <= c.change <= c.high
        assert c.verdict != "better", f"{c.retriever}@{c.k} beats {c.baseline} on {corpus_name}"
    for r in report.retrieval:
        assert r.recall_low <= r.recall <= r.recall_high
