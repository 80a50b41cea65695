"""The one schema of the application store: memory tiers and the retrieval corpus.

Memory and retrieval share one SQLite file, so one version number describes it. Every
searchable table has an external-content FTS5 index kept in step by triggers (BM25 comes
from FTS5) and an `embedding` column of float32 bytes (cosine is computed in numpy).
Dates are ISO 8601 text, so comparing strings compares dates.
"""

from __future__ import annotations

SCHEMA_VERSION = 1
APPLICATION_ID = "ctxlab-memory"


def _fts(table: str, column: str) -> str:
    """An FTS5 index over `table.column` plus the three triggers that keep it current."""
    return f"""
CREATE VIRTUAL TABLE {table}_fts USING fts5(
    {column}, content='{table}', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER {table}_ai AFTER INSERT ON {table} BEGIN
    INSERT INTO {table}_fts(rowid, {column}) VALUES (new.id, new.{column});
END;
CREATE TRIGGER {table}_ad AFTER DELETE ON {table} BEGIN
    INSERT INTO {table}_fts({table}_fts, rowid, {column}) VALUES ('delete', old.id, old.{column});
END;
CREATE TRIGGER {table}_au AFTER UPDATE OF {column} ON {table} BEGIN
    INSERT INTO {table}_fts({table}_fts, rowid, {column}) VALUES ('delete', old.id, old.{column});
    INSERT INTO {table}_fts(rowid, {column}) VALUES (new.id, new.{column});
END;
"""


SCHEMA = f"""
CREATE TABLE schema_version (
    application TEXT NOT NULL,
    version INTEGER NOT NULL
);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

-- core memory: labelled blocks always in the prompt
CREATE TABLE core_blocks (
    agent TEXT NOT NULL,
    label TEXT NOT NULL,
    value TEXT NOT NULL,
    char_limit INTEGER NOT NULL,
    read_only INTEGER NOT NULL DEFAULT 0,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (agent, label)
);

-- recall memory: every message of every session
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    agent TEXT NOT NULL,
    session TEXT NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    created_at TEXT NOT NULL,
    embedding BLOB
);
CREATE INDEX messages_by_agent ON messages(agent, created_at);
{_fts("messages", "content")}

-- archival memory: passages with tags
CREATE TABLE passages (
    id INTEGER PRIMARY KEY,
    agent TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at TEXT NOT NULL,
    embedding BLOB
);
CREATE TABLE passage_tags (
    passage INTEGER NOT NULL REFERENCES passages(id) ON DELETE CASCADE,
    tag TEXT NOT NULL,
    PRIMARY KEY (passage, tag)
);
{_fts("passages", "text")}

-- retrieval corpus: one row per document version, its chunks
CREATE TABLE documents (
    id INTEGER PRIMARY KEY,
    doc_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    date TEXT NOT NULL,
    title TEXT NOT NULL,
    source TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    ingested_at TEXT NOT NULL,
    chunk_tokens INTEGER NOT NULL,
    overlap_tokens INTEGER NOT NULL,
    tokenizer TEXT NOT NULL,
    UNIQUE (doc_id, version)
);
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY,
    document INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    chunk INTEGER NOT NULL,
    text TEXT NOT NULL,
    start_char INTEGER NOT NULL,
    end_char INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    embedding BLOB,
    UNIQUE (document, chunk)
);
{_fts("chunks", "text")}
"""
