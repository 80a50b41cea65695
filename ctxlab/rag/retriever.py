"""Search the corpus: the newest version of each document, ranked by BM25, vectors or both.

Conflicts between versions are settled by metadata before ranking: only each document's
newest version (or the newest dated on or before `as_of`) is searched, so an answer can
only cite current text. `order_passages` can lay the retrieved passages out against
"lost in the middle" (Liu et al., 2023: models use the start and end of a long context
best): the strongest passages go to both edges and the weakest to the middle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxlab.errors import CtxlabError
from ctxlab.memory.embed import Embedder
from ctxlab.memory.search import Filter, Table, search
from ctxlab.memory.store import Store
from ctxlab.rag.readers import check_date

CHUNKS = Table("chunks", "text")
# The default retriever is BM25 over each chunk's heading and text. Measured on the seeded
# fixture (100 questions) and on the Coriolanus prose corpus (32 reworded questions), no
# fusion with WordLlama vectors (RRF at constants 1, 10, 60; dense weights 1, 0.5, 0.25; a
# min-max convex mix) was better than BM25 at any k beyond noise, and most were worse at
# k = 1: WordLlama averages static token vectors, which cannot tell made-up names apart nor
# match reworded Early Modern English (dense recall@1 0.21 and 0.13). docs/statistics.md and
# benchmarks/rag_retrievers.py give the figures.
DEFAULT_RETRIEVER = "bm25"
ORDERS = ("relevance", "edges")


@dataclass(frozen=True)
class Passage:
    doc_id: str
    version: int
    date: str
    chunk: int
    text: str
    title: str
    score: float
    rank: int

    @property
    def key(self) -> str:
        """The citation key, `doc#chunk`."""
        return f"{self.doc_id}#{self.chunk}"


def version_filter(as_of: str | None = None, all_versions: bool = False) -> Filter:
    if all_versions:
        return Filter()
    if as_of is None:
        return Filter(
            "t.document IN (SELECT d.id FROM documents d WHERE d.version = "
            "(SELECT MAX(e.version) FROM documents e WHERE e.doc_id = d.doc_id))"
        )
    day = check_date(as_of, "--as-of")
    return Filter(
        "t.document IN (SELECT d.id FROM documents d WHERE d.version = "
        "(SELECT MAX(e.version) FROM documents e WHERE e.doc_id = d.doc_id AND e.date <= ?))",
        (day,),
    )


class CorpusRetriever:
    def __init__(self, store: Store, embedder: Embedder | None) -> None:
        self.store, self.embedder = store, embedder

    def chunk_count(self) -> int:
        return int(self.store.conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0])

    def search(
        self,
        query: str,
        k: int = 4,
        retriever: str = DEFAULT_RETRIEVER,
        as_of: str | None = None,
        all_versions: bool = False,
    ) -> list[Passage]:
        if k < 1:
            raise CtxlabError(f"--k must be at least 1, got {k}.")
        where = version_filter(as_of, all_versions)
        hits = search(self.store.conn, CHUNKS, query, k, retriever, self.embedder, where)
        out = []
        for hit in hits:
            row = self.store.conn.execute(
                "SELECT d.doc_id, d.version, d.date, c.chunk, c.text, d.title FROM chunks c "
                "JOIN documents d ON d.id = c.document WHERE c.id = ?",
                (hit.rowid,),
            ).fetchone()
            out.append(
                Passage(
                    row[0], int(row[1]), row[2], int(row[3]), row[4], row[5], hit.score, hit.rank
                )
            )
        return out

    def passage(self, doc_id: str, chunk: int, version: int | None = None) -> Passage:
        """One chunk by its citation key (newest version unless given)."""
        row = self.store.conn.execute(
            "SELECT d.doc_id, d.version, d.date, c.chunk, c.text, d.title FROM chunks c "
            "JOIN documents d ON d.id = c.document WHERE d.doc_id = ? AND c.chunk = ? "
            "AND d.version = COALESCE(?, (SELECT MAX(version) FROM documents WHERE doc_id = ?))",
            (doc_id, chunk, version, doc_id),
        ).fetchone()
        if row is None:
            raise CtxlabError(f"the corpus has no chunk {doc_id}#{chunk}.")
        return Passage(row[0], int(row[1]), row[2], int(row[3]), row[4], row[5], 0.0, 0)


def order_passages(passages: Sequence[Passage], order: str = "relevance") -> list[Passage]:
    """`relevance`: best first. `edges`: best at the start and end, weakest in the middle."""
    if order not in ORDERS:
        raise CtxlabError(f"--order {order!r} is unknown; use one of {', '.join(ORDERS)}.")
    ranked = sorted(passages, key=lambda p: p.rank)
    if order == "relevance":
        return ranked
    front, back = ranked[0::2], ranked[1::2]
    return front + back[::-1]
