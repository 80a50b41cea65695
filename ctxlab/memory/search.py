"""BM25 (FTS5), dense (cosine) and hybrid (reciprocal rank fusion) search over one table.

Each searchable table (messages, passages, chunks) is described by a `Table`; a caller adds
its own filter (role, date, tags, newest version) as SQL over the table's alias `t`, so the
three retrievers always see the same candidate set. Hybrid fuses the two ranked lists with
reciprocal rank fusion, score = sum over lists of 1 / (RRF_K + rank), RRF_K = 60 as in
Cormack, Clarke and Buettcher (SIGIR 2009); it needs no score calibration between BM25 and
cosine, which is why it is the usual way to combine them.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ctxlab.errors import CtxlabError
from ctxlab.memory.embed import Embedder, from_blobs

if TYPE_CHECKING:  # numpy loads on first dense search: BM25 never needs it
    import numpy as np

Retriever = Literal["bm25", "dense", "hybrid"]
RETRIEVERS: tuple[str, ...] = ("bm25", "dense", "hybrid")
RRF_K = 60
HYBRID_DEPTH = 50  # candidates taken from each list before fusing
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class Table:
    """A searchable table: its name, its FTS5 index and the column both hold."""

    name: str
    text: str

    @property
    def fts(self) -> str:
        return f"{self.name}_fts"


@dataclass(frozen=True)
class Filter:
    """SQL over alias `t` (e.g. "t.role = ?") and its parameters; empty means every row."""

    sql: str = "1"
    params: tuple[object, ...] = ()


@dataclass(frozen=True)
class Hit:
    rowid: int
    score: float
    rank: int  # 1-based


def check_retriever(name: str) -> str:
    if name not in RETRIEVERS:
        raise CtxlabError(f"retriever {name!r} is unknown; use one of {', '.join(RETRIEVERS)}.")
    return name


def fts_query(text: str) -> str | None:
    """Free text -> an FTS5 query that ORs every word (each quoted, so no syntax leaks)."""
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(text)))
    if not words:
        return None
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in words)


def bm25(
    conn: sqlite3.Connection, table: Table, query: str, k: int, where: Filter = Filter()
) -> list[Hit]:
    """Top k rows by FTS5's BM25 (lower bm25() is better; scores are returned negated)."""
    match = fts_query(query)
    if match is None or k <= 0:
        return []
    rows = conn.execute(
        f"SELECT t.id, bm25({table.fts}) AS s FROM {table.fts} "
        f"JOIN {table.name} t ON t.id = {table.fts}.rowid "
        f"WHERE {table.fts} MATCH ? AND ({where.sql}) ORDER BY s, t.id LIMIT ?",
        (match, *where.params, k),
    ).fetchall()
    return [Hit(int(r[0]), -float(r[1]), i + 1) for i, r in enumerate(rows)]


def dense(
    conn: sqlite3.Connection,
    table: Table,
    query_vector: np.ndarray,
    k: int,
    where: Filter = Filter(),
) -> list[Hit]:
    """Top k rows by cosine similarity of their stored vector to the query's (numpy)."""
    import numpy as np

    if k <= 0:
        return []
    rows = conn.execute(
        f"SELECT t.id, t.embedding FROM {table.name} t "
        f"WHERE t.embedding IS NOT NULL AND ({where.sql}) ORDER BY t.id",
        where.params,
    ).fetchall()
    if not rows:
        return []
    matrix = from_blobs([r[1] for r in rows], int(query_vector.shape[-1]))
    scores = matrix @ query_vector.astype(np.float32)
    order = np.lexsort((np.arange(len(rows)), -scores))[:k]  # ties: older row first
    return [Hit(int(rows[i][0]), float(scores[i]), n + 1) for n, i in enumerate(order)]


def reciprocal_rank_fusion(lists: Sequence[Sequence[Hit]], k: int) -> list[Hit]:
    """Fuse ranked lists: score(row) = sum 1/(RRF_K + rank); ties by best single rank."""
    fused: dict[int, float] = {}
    best: dict[int, int] = {}
    for hits in lists:
        for hit in hits:
            fused[hit.rowid] = fused.get(hit.rowid, 0.0) + 1.0 / (RRF_K + hit.rank)
            best[hit.rowid] = min(best.get(hit.rowid, hit.rank), hit.rank)
    order = sorted(fused, key=lambda r: (-fused[r], best[r], r))[:k]
    return [Hit(r, fused[r], i + 1) for i, r in enumerate(order)]


def search(
    conn: sqlite3.Connection,
    table: Table,
    query: str,
    k: int,
    retriever: str,
    embedder: Embedder | None,
    where: Filter = Filter(),
) -> list[Hit]:
    """The top k rows for `query` by one retriever."""
    check_retriever(retriever)
    if retriever == "bm25":
        return bm25(conn, table, query, k, where)
    if embedder is None:
        raise CtxlabError(f"the {retriever} retriever needs an embedder.")
    vector = embedder.embed([query])[0]
    if retriever == "dense":
        return dense(conn, table, vector, k, where)
    depth = max(4 * k, HYBRID_DEPTH)  # the same depth for every small k: prefixes agree
    return reciprocal_rank_fusion(
        [bm25(conn, table, query, depth, where), dense(conn, table, vector, depth, where)], k
    )
