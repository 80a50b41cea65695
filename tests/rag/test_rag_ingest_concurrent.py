"""Two real processes ingesting the same folder into one store at once: neither crashes
(the "already stored?" check runs again inside the write transaction), and every document
is stored once, as version 1 (the second tour's fault case)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

N_DOCS = 120

WORKER = """
import re, sys, time
from pathlib import Path
from ctxlab.memory.store import open_store
from ctxlab.rag.documents import ingest
from ctxlab.rag.readers import SourceDoc

class Words:
    name = "words"
    def spans(self, text):
        return [m.span() for m in re.finditer(r"\\S+", text)]

db, go = sys.argv[1], Path(sys.argv[2])
docs = [SourceDoc(f"d{i}", f"Document {i} says the number {i * 7}.", "2024-01-01", f"T{i}",
                  f"d{i}.txt") for i in range(int(sys.argv[3]))]
while not go.exists():
    time.sleep(0.001)
with open_store(db) as store:
    statuses = [ingest(store, d, Words(), None, 16, 2).status for d in docs]
print(statuses.count("new"), statuses.count("unchanged"))
"""


def test_two_processes_ingest_the_same_folder_at_once(tmp_path: Path) -> None:
    db, go = tmp_path / "kb.db", tmp_path / "go"
    from ctxlab.memory.store import open_store

    open_store(db).close()  # the schema exists before the race, as after a first ingest
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(db), str(go), str(N_DOCS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    time.sleep(1.0)  # both interpreters are up and waiting
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert "IntegrityError" not in err
    new = sum(int(out.split()[0]) for out, _ in outs)
    unchanged = sum(int(out.split()[1]) for out, _ in outs)
    assert new == N_DOCS and unchanged == N_DOCS  # each document stored by exactly one
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT COUNT(*), MAX(version) FROM documents").fetchone()
        check = conn.execute("PRAGMA integrity_check").fetchone()[0]
    assert rows == (N_DOCS, 1) and check == "ok"
