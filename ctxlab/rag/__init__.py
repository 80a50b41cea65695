"""Retrieval with citations over the application store.

Public API (plain dataclasses, no torch at import):

- `collect(paths)` -> `SourceDoc`s; `ingest(store, doc, tokenizer, embedder, ...)` ->
  `IngestResult` (new, new version or unchanged).
- `CorpusRetriever(store, embedder).search(query, k, retriever)` -> `Passage`s (newest
  version of each document; `as_of` for an earlier state); `order_passages(..., "edges")`.
- `ask(backend, store, question, k=4)` -> `Answer` with `[doc#chunk]` citations.
- `evaluate(backend, db=None, ks=(1, 2, 4, 8), ...)` -> `EvalReport` (retrieval, task and
  cost tables); `corpus_fixture(seed)` -> the seeded corpus and its 100 gold questions;
  `named_corpus(paths, questions_file)` for your own corpus (`evaluate(..., corpus=...)`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxlab.lazy import lazy_attributes
from ctxlab.rag.ask import ask  # eager: the submodule `ask` would otherwise shadow it

# `documents` and `evaluate` are submodules as well as functions; once either submodule is
# imported its name on this package is the module, so import the functions from
# `ctxlab.rag.documents` and `ctxlab.rag.evaluate` (they are not listed below).

# Other names resolve on first use, so importing one module of the package (`rag ask` needs
# a few) does not import evaluation, corpora and readers.
_WHERE = {
    "Answer": "ctxlab.rag.answer",
    "answer_chat": "ctxlab.rag.answer",
    "answer_questions": "ctxlab.rag.answer",
    "CorpusFixture": "ctxlab.rag.corpus",
    "GoldQuestion": "ctxlab.rag.corpus",
    "corpus_fixture": "ctxlab.rag.corpus",
    "DocumentInfo": "ctxlab.rag.documents",
    "IngestResult": "ctxlab.rag.documents",
    "ingest": "ctxlab.rag.documents",
    "ingest_all": "ctxlab.rag.documents",
    "EXAMPLE_PRICES": "ctxlab.rag.evaluate",
    "EvalOptions": "ctxlab.rag.evaluate",
    "named_corpus": "ctxlab.rag.evaluate",
    "SourceDoc": "ctxlab.rag.readers",
    "collect": "ctxlab.rag.readers",
    "CostRow": "ctxlab.rag.report",
    "EvalReport": "ctxlab.rag.report",
    "RetrievalRow": "ctxlab.rag.report",
    "TaskRow": "ctxlab.rag.report",
    "CorpusRetriever": "ctxlab.rag.retriever",
    "Passage": "ctxlab.rag.retriever",
    "order_passages": "ctxlab.rag.retriever",
}

if TYPE_CHECKING:
    from ctxlab.rag.answer import Answer, answer_chat, answer_questions
    from ctxlab.rag.corpus import CorpusFixture, GoldQuestion, corpus_fixture
    from ctxlab.rag.documents import DocumentInfo, IngestResult, ingest, ingest_all
    from ctxlab.rag.evaluate import EXAMPLE_PRICES, EvalOptions, named_corpus
    from ctxlab.rag.readers import SourceDoc, collect
    from ctxlab.rag.report import CostRow, EvalReport, RetrievalRow, TaskRow
    from ctxlab.rag.retriever import CorpusRetriever, Passage, order_passages


__getattr__ = lazy_attributes(__name__, _WHERE, globals())


__all__ = [
    "EXAMPLE_PRICES",
    "Answer",
    "CorpusFixture",
    "CorpusRetriever",
    "CostRow",
    "DocumentInfo",
    "EvalOptions",
    "EvalReport",
    "GoldQuestion",
    "IngestResult",
    "Passage",
    "RetrievalRow",
    "SourceDoc",
    "TaskRow",
    "answer_chat",
    "answer_questions",
    "ask",
    "collect",
    "corpus_fixture",
    "ingest",
    "ingest_all",
    "named_corpus",
    "order_passages",
]
