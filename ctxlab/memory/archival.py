"""Archival memory: passages an agent chose to keep, with tags, searchable like recall."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxlab.memory.embed import Embedder, to_blob
from ctxlab.memory.search import Filter, Table, search
from ctxlab.memory.store import Store, now_iso

PASSAGES = Table("passages", "text")


@dataclass(frozen=True)
class Passage:
    id: int
    text: str
    tags: tuple[str, ...]
    created_at: str


class ArchivalMemory:
    def __init__(self, store: Store, embedder: Embedder | None, agent: str = "default"):
        self.store, self.embedder, self.agent = store, embedder, agent

    def insert(self, text: str, tags: Sequence[str] = ()) -> Passage:
        vector = self.embedder.embed([text])[0] if self.embedder else None
        created = now_iso()
        clean = tuple(dict.fromkeys(t.strip() for t in tags if t.strip()))
        with self.store.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO passages(agent, text, created_at, embedding) VALUES (?, ?, ?, ?)",
                (self.agent, text, created, None if vector is None else to_blob(vector)),
            )
            pid = int(cur.lastrowid or 0)
            conn.executemany(
                "INSERT INTO passage_tags(passage, tag) VALUES (?, ?)", [(pid, t) for t in clean]
            )
        return Passage(pid, text, clean, created)

    def search(
        self,
        query: str,
        k: int = 5,
        retriever: str = "hybrid",
        tags: Sequence[str] = (),
        offset: int = 0,
    ) -> list[Passage]:
        """Passages matching `query`; with `tags`, only passages carrying every one of them."""
        sql, params = ["t.agent = ?"], [self.agent]
        for tag in tags:
            sql.append("EXISTS (SELECT 1 FROM passage_tags g WHERE g.passage = t.id AND g.tag = ?)")
            params.append(tag)
        where = Filter(" AND ".join(sql), tuple(params))
        hits = search(self.store.conn, PASSAGES, query, k + offset, retriever, self.embedder, where)
        return self._get([h.rowid for h in hits[offset:]])

    def _get(self, ids: Sequence[int]) -> list[Passage]:
        out = []
        for pid in ids:
            row = self.store.conn.execute(
                "SELECT text, created_at FROM passages WHERE id = ?", (pid,)
            ).fetchone()
            tags = self.store.conn.execute(
                "SELECT tag FROM passage_tags WHERE passage = ? ORDER BY tag", (pid,)
            ).fetchall()
            out.append(Passage(pid, row[0], tuple(t[0] for t in tags), row[1]))
        return out

    def count(self) -> int:
        row = self.store.conn.execute(
            "SELECT COUNT(*) FROM passages WHERE agent = ?", (self.agent,)
        ).fetchone()
        return int(row[0])
