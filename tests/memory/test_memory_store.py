"""The store: created with its schema, refuses files it cannot use in one sentence, survives
a writer killed mid-batch, and serves readers while a writer writes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.memory.messages import Message
from ctxlab.memory.recall import RecallMemory
from ctxlab.memory.schema import SCHEMA_VERSION
from ctxlab.memory.store import open_store

ROOT = Path(__file__).resolve().parents[2]


def one_sentence(text: str) -> bool:
    return text.count(". ") == 0 and text.endswith(".") and "Traceback" not in text


def test_new_store_has_schema_version_and_wal(tmp_path):
    with open_store(tmp_path / "a.db") as store:
        assert store.conn.execute("SELECT version FROM schema_version").fetchone()[0] == (
            SCHEMA_VERSION
        )
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        RecallMemory(store, None).add([Message("user", "hello there")])
    with open_store(tmp_path / "a.db") as store:  # reopening keeps the data
        assert RecallMemory(store, None).count() == 1


def test_transaction_is_all_or_nothing(tmp_path):
    with open_store(tmp_path / "a.db") as store:
        with pytest.raises(RuntimeError), store.transaction() as conn:
            conn.execute(
                "INSERT INTO messages(agent, session, role, content, created_at) "
                "VALUES ('a', 's', 'user', 'x', '2024')"
            )
            raise RuntimeError("boom")
        assert store.conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


@pytest.mark.parametrize(
    ("make", "phrase"),
    [
        (lambda p: p.write_bytes(b"this is not sqlite at all" * 100), "not a ctxlab database"),
        (lambda p: p.mkdir(), "is a directory"),
        (
            lambda p: sqlite3.connect(p).execute("CREATE TABLE foreign_t (x)").connection.commit(),
            "another application",
        ),
    ],
    ids=["corrupt", "directory", "foreign"],
)
def test_unusable_files_are_one_sentence(tmp_path, make, phrase):
    path = tmp_path / "bad.db"
    make(path)
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(CtxlabError) as err:
        open_store(path)
    assert phrase in str(err.value)
    assert one_sentence(str(err.value))
    if before is not None:
        assert path.read_bytes() == before  # a foreign file is never changed


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "a.db"
    with open_store(path) as store:
        store.conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(CtxlabError, match="newer than"):
        open_store(path)


def test_unwritable_paths_are_one_sentence(tmp_path):
    with pytest.raises(CtxlabError) as err:
        open_store("/proc/ctxlab-test/memory.db")  # a folder nobody can create
    assert one_sentence(str(err.value))
    if os.geteuid() != 0:  # root writes through file modes, so this part needs a user
        path = tmp_path / "ro.db"
        open_store(path).close()
        path.chmod(0o444)
        tmp_path.chmod(0o555)
        try:
            with pytest.raises(CtxlabError) as err:
                RecallMemory(open_store(path), None).add([Message("user", "x")])
            assert "read-only" in str(err.value)
        finally:
            tmp_path.chmod(0o755)


WRITER = textwrap.dedent(
    """
    import sys, time
    from ctxlab.memory.store import open_store
    path, batch, pause_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = open_store(path)
    i = 0
    while True:
        with store.transaction() as conn:
            for j in range(batch):
                conn.execute(
                    "INSERT INTO messages(agent, session, role, content, created_at) "
                    "VALUES ('w', ?, 'user', ?, '2024-01-01')",
                    (f"batch-{i}", f"message {i} {j} about durable storage"),
                )
                if i == pause_at and j == batch // 2:
                    print("mid-batch", flush=True)
                    time.sleep(60)
        print(f"committed {i}", flush=True)
        i += 1
    """
)


def _writer(path: Path, batch: int, pause_at: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(batch), str(pause_at)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _check_intact(path: Path, batch: int) -> int:
    with open_store(path) as store:
        conn = store.conn
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
        sizes = conn.execute("SELECT COUNT(*) FROM messages GROUP BY session").fetchall()
        assert all(n == batch for (n,) in sizes), sizes  # no partial batch survives
        total = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        hits = conn.execute(
            "SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH 'durable'"
        ).fetchone()[0]
        assert hits == total  # the full-text index matches the table
        RecallMemory(store, None, "after").add([Message("user", "still writable")])
        return total


def test_writer_killed_mid_batch_loses_no_committed_record(tmp_path):
    path, batch = tmp_path / "kill.db", 40
    proc = _writer(path, batch, pause_at=3)
    committed = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("committed"):
            committed.append(int(line.split()[1]))
        if line.startswith("mid-batch"):
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert committed == [0, 1, 2]
    assert _check_intact(path, batch) == 3 * batch


def test_writer_killed_at_a_random_moment_leaves_whole_batches(tmp_path):
    path, batch = tmp_path / "kill2.db", 25
    proc = _writer(path, batch, pause_at=-1)
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen = int(line.split()[1]) + 1
        if seen >= 5:
            break
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    total = _check_intact(path, batch)
    assert total >= seen * batch


def test_readers_read_while_a_writer_writes(tmp_path):
    path, batch = tmp_path / "busy.db", 20
    open_store(path).close()
    proc = _writer(path, batch, pause_at=-1)
    counts = []
    try:
        deadline = time.monotonic() + 60  # stop once the writer is seen moving
        with open_store(path) as reader:
            while time.monotonic() < deadline and len(set(counts) - {0}) < 3:
                counts.append(reader.conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
                time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert counts == sorted(counts)  # never goes back
    assert all(c % batch == 0 for c in counts)  # a reader never sees half a batch
    assert counts[-1] > counts[0]  # and it saw the writer's progress
