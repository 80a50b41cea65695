"""`ask`: retrieve, order, answer and cite, in one call (what `ctxlab rag ask` runs).

Each phase is timed (`Answer.seconds`: retrieval, model load, model call), so the time a
question costs beyond its model call can be read from one run (`benchmarks/rag_ask_overhead.py`).
A backend that loads lazily (`Loads`: the in-process engine) is loaded before the call, so
the load is not counted as the call; a server's model is already loaded (load 0).
"""

from __future__ import annotations

import time

from ctxlab.errors import CtxlabError
from ctxlab.memory.backend import Backend, Loads
from ctxlab.memory.embed import Embedder, WordLlamaEmbedder
from ctxlab.memory.store import Store
from ctxlab.rag.answer import Answer, answer_questions
from ctxlab.rag.retriever import DEFAULT_RETRIEVER, CorpusRetriever, order_passages


def ask(
    backend: Backend,
    store: Store,
    question: str,
    k: int = 4,
    retriever: str = DEFAULT_RETRIEVER,
    order: str = "relevance",
    as_of: str | None = None,
    max_tokens: int = 32,
    embedder: Embedder | None = None,
    metadata: str = "auto",
) -> Answer:
    if not question.strip():
        raise CtxlabError("the question is empty.")
    start = time.perf_counter()
    search = CorpusRetriever(store, embedder if embedder is not None else WordLlamaEmbedder())
    if search.chunk_count() == 0:
        raise CtxlabError(
            f"{store.path} holds no documents; add some with `ctxlab rag ingest PATH`."
        )
    passages = order_passages(search.search(question, k, retriever, as_of), order)
    searched = time.perf_counter()
    if isinstance(backend, Loads):
        backend.load()
    loaded = time.perf_counter()
    answer = answer_questions(backend, [question], [passages], max_tokens, metadata)[0]
    answer.seconds = {
        "retrieval": searched - start,
        "model_load": loaded - searched,
        "model_call": time.perf_counter() - loaded,
    }
    return answer
