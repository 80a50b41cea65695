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

from ctxlab.rag.answer import Answer, answer_chat, answer_questions
from ctxlab.rag.ask import ask
from ctxlab.rag.corpus import CorpusFixture, GoldQuestion, corpus_fixture
from ctxlab.rag.documents import DocumentInfo, IngestResult, documents, ingest, ingest_all
from ctxlab.rag.evaluate import EXAMPLE_PRICES, EvalOptions, evaluate, named_corpus
from ctxlab.rag.readers import SourceDoc, collect
from ctxlab.rag.report import CostRow, EvalReport, RetrievalRow, TaskRow
from ctxlab.rag.retriever import CorpusRetriever, Passage, order_passages

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
    "documents",
    "evaluate",
    "ingest",
    "ingest_all",
    "named_corpus",
    "order_passages",
]
