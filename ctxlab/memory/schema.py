"""The one schema of the application store: memory tiers and the retrieval corpus.

Memory and retrieval share one SQLite file, so one version number describes it. Every
searchable table has an external-content FTS5 index kept in step by triggers (a chunk's
index holds its heading, the document's title, beside its text) (BM25 comes
from FTS5) and an `embedding` column of float32 bytes (cosine is computed in numpy).
Dates are ISO 8601 text, so comparing strings compares dates.
"""

from __future__ import annotations

SCHEMA_VERSION = 2
APPLICATION_ID = "ctxlab-memory"


def _fts(table: str, *columns: str) -> str:
    """An FTS5 index over `table`'s columns plus the three triggers that keep it current."""
    cols = ", ".join(columns)
    new = ", ".join(f"new.{c}" for c in columns)
    old = ", ".join(f"old.{c}" for c in columns)
    return f"""
CREATE VIRTUAL TABLE {table}_fts USING fts5(
    {cols}, content='{table}', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER {table}_ai AFTER INSERT ON {table} BEGIN
    INSERT INTO {table}_fts(rowid, {cols}) VALUES (new.id, {new});
END;
CREATE TRIGGER {table}_ad AFTER DELETE ON {table} BEGIN
    INSERT INTO {table}_fts({table}_fts, rowid, {cols}) VALUES ('delete', old.id, {old});
END;
CREATE TRIGGER {table}_au AFTER UPDATE OF {cols} ON {table} BEGIN
    INSERT INTO {table}_fts({table}_fts, rowid, {cols}) VALUES ('delete', old.id, {old});
    INSERT INTO {table}_fts(rowid, {cols}) VALUES (new.id, {new});
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
    heading TEXT NOT NULL DEFAULT '',
    UNIQUE (document, chunk)
);
{_fts("chunks", "heading", "text")}
"""

# Version 1 indexed a chunk's text alone; version 2 also indexes its heading (the document's
# title), so a chunk that never names its subject ("Its founder ... was born in ...") is
# still found by a question that does.
MIGRATE_1_TO_2 = f"""
ALTER TABLE chunks ADD COLUMN heading TEXT NOT NULL DEFAULT '';
UPDATE chunks SET heading = (SELECT d.title FROM documents d WHERE d.id = chunks.document);
DROP TRIGGER chunks_ai;
DROP TRIGGER chunks_ad;
DROP TRIGGER chunks_au;
DROP TABLE chunks_fts;
{_fts("chunks", "heading", "text")}
INSERT INTO chunks_fts(chunks_fts) VALUES ('rebuild');
UPDATE schema_version SET version = 2;
"""
