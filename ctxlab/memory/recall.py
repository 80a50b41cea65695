"""Recall memory: every message of every session, searchable by text and by vector.

Messages are written as they happen (one transaction per batch) whatever the context
strategy does with them, so the full record survives compaction. Search filters by agent,
role, session and date range, and returns the messages ranked by the chosen retriever.

Importing a history (`import_history`) is idempotent: a message already stored for the agent
(same session, role and text, and the same date when the file gives one) is not stored
again, counted as a multiset so a history that says "ok" twice keeps both, and a history
that grew since the last import adds only its new messages. The comparison runs again
inside the write transaction, so two imports at once store each message once.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from ctxlab.memory.embed import Embedder, to_blob
from ctxlab.memory.messages import Message
from ctxlab.memory.search import Filter, Table, search
from ctxlab.memory.store import Store, now_iso

MESSAGES = Table("messages", "content")


class RecallMemory:
    def __init__(self, store: Store, embedder: Embedder | None, agent: str = "default"):
        self.store, self.embedder, self.agent = store, embedder, agent

    def add(self, messages: Sequence[Message]) -> list[Message]:
        """Store messages (one transaction); returns them with their ids and dates."""
        if not messages:
            return []
        vectors = self._embed(messages)
        with self.store.transaction() as conn:
            return self._insert(conn, messages, vectors)

    def import_history(self, messages: Sequence[Message]) -> tuple[list[Message], int]:
        """Store the messages not stored yet; (the stored ones, how many were already there)."""
        new = self._not_stored(self.store.conn, messages)
        vectors = self._embed(new)
        with self.store.transaction() as conn:
            again = self._not_stored(conn, messages)  # under the write lock
            if again != new:  # another writer stored some meanwhile
                new, vectors = again, self._embed(again)
            stored = self._insert(conn, new, vectors)
        return stored, len(messages) - len(stored)

    def _embed(self, messages: Sequence[Message]) -> list | None:
        if not messages or self.embedder is None:
            return None
        return list(self.embedder.embed([m.content for m in messages]))

    def _insert(
        self, conn: sqlite3.Connection, messages: Sequence[Message], vectors: list | None
    ) -> list[Message]:
        stored = []
        for i, m in enumerate(messages):
            created = m.created_at or now_iso()
            cur = conn.execute(
                "INSERT INTO messages(agent, session, role, content, created_at, embedding) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    self.agent,
                    m.session,
                    m.role,
                    m.content,
                    created,
                    None if vectors is None else to_blob(vectors[i]),
                ),
            )
            stored.append(replace(m, id=int(cur.lastrowid or 0), created_at=created))
        return stored

    def _not_stored(self, conn: sqlite3.Connection, messages: Sequence[Message]) -> list[Message]:
        """The messages of `messages` beyond those the agent has stored (a multiset match)."""
        exact: Counter[tuple[str, str, str, str]] = Counter()
        loose: Counter[tuple[str, str, str]] = Counter()
        rows = conn.execute(
            "SELECT session, role, content, created_at FROM messages WHERE agent = ?",
            (self.agent,),
        )
        for session, role, content, created in rows:
            exact[(session, role, content, created)] += 1
            loose[(session, role, content)] += 1
        new = []
        for m in messages:
            key = (m.session, m.role, m.content)
            if m.created_at and exact[(*key, m.created_at)] > 0:
                exact[(*key, m.created_at)] -= 1
                loose[key] -= 1
            elif not m.created_at and loose[key] > 0:
                loose[key] -= 1  # an undated message matches a stored one of any date
            else:
                new.append(m)
        return new

    def forget(self, ids: Sequence[int]) -> int:
        """Delete messages from the log for good (their index rows go with them); returns
        how many were deleted. Only a strategy that discards history calls this."""
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        with self.store.transaction() as conn:
            cur = conn.execute(
                f"DELETE FROM messages WHERE agent = ? AND id IN ({marks})",
                (self.agent, *ids),
            )
        return int(cur.rowcount)

    def count(self) -> int:
        row = self.store.conn.execute(
            "SELECT COUNT(*) FROM messages WHERE agent = ?", (self.agent,)
        ).fetchone()
        return int(row[0])

    def get(self, ids: Sequence[int]) -> list[Message]:
        """Messages by id, in the order asked."""
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = self.store.conn.execute(
            f"SELECT id, role, content, session, created_at FROM messages WHERE id IN ({marks})",
            tuple(ids),
        ).fetchall()
        by_id = {int(r[0]): Message(r[1], r[2], r[3], r[4], int(r[0])) for r in rows}
        return [by_id[i] for i in ids if i in by_id]

    def search(
        self,
        query: str,
        k: int = 5,
        retriever: str = "hybrid",
        roles: Sequence[str] | None = None,
        session: str | None = None,
        start: str | None = None,
        end: str | None = None,
        exclude: Sequence[int] = (),
    ) -> list[Message]:
        """The k messages that best match `query` among those passing every filter.

        `start`/`end` are ISO dates or times; `end` given as a date includes that whole day.
        """
        sql = ["t.agent = ?"]
        params: list[object] = [self.agent]
        if roles:
            sql.append(f"t.role IN ({','.join('?' * len(roles))})")
            params += list(roles)
        if session is not None:
            sql.append("t.session = ?")
            params.append(session)
        if start:
            sql.append("t.created_at >= ?")
            params.append(start)
        if end:
            sql.append("t.created_at <= ?")
            params.append(end + "\uffff" if len(end) == 10 else end)
        if exclude:
            sql.append(f"t.id NOT IN ({','.join('?' * len(exclude))})")
            params += list(exclude)
        where = Filter(" AND ".join(sql), tuple(params))
        hits = search(self.store.conn, MESSAGES, query, k, retriever, self.embedder, where)
        return self.get([h.rowid for h in hits])

    def get_all(self) -> list[Message]:
        """Every message of this agent, oldest first."""
        rows = self.store.conn.execute(
            "SELECT id, role, content, session, created_at FROM messages WHERE agent = ? "
            "ORDER BY id",
            (self.agent,),
        ).fetchall()
        return [Message(r[1], r[2], r[3], r[4], int(r[0])) for r in rows]
