"""`ask`: retrieve, order, answer and cite, in one call (what `ctxlab rag ask` runs)."""

from __future__ import annotations

from ctxlab.errors import CtxlabError
from ctxlab.memory.backend import Backend
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
    search = CorpusRetriever(store, embedder if embedder is not None else WordLlamaEmbedder())
    if search.chunk_count() == 0:
        raise CtxlabError(
            f"{store.path} holds no documents; add some with `ctxlab rag ingest PATH`."
        )
    passages = order_passages(search.search(question, k, retriever, as_of), order)
    return answer_questions(backend, [question], [passages], max_tokens, metadata)[0]
