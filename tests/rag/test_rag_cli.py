"""`ctxlab rag` as a user runs it: ingest twice (the second is a no-op), list, and bad input
as one sentence with exit code 2."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import run_in_process


def run(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    r = run_in_process(monkeypatch, capsys, *args)
    return r.code, r.out, r.err


@pytest.mark.model
def test_fixture_ingest_twice_and_list(monkeypatch, capsys, tmp_path, gguf_path, tokenizer):
    import ctxlab.model.tokenizer as tokenizers

    # the session already built this file's tokenizer; building it again costs ~10 s
    monkeypatch.setattr(tokenizers, "load_tokenizer", lambda path, extra=(): tokenizer)
    db = str(tmp_path / "c.db")
    code, _, _ = run(monkeypatch, capsys, "rag", "fixture", "--out", str(tmp_path / "fx"))
    assert code == 0
    picked = tmp_path / "some"
    picked.mkdir()
    versioned = sorted((tmp_path / "fx/docs").glob("*.v2.md"))[0].name.removesuffix(".v2.md")
    for f in sorted((tmp_path / "fx/docs").glob(f"{versioned}.v*.md")):  # both versions
        (picked / f.name).write_text(f.read_text())
    args = ["rag", "ingest", str(picked), "--db", db, "--model", str(gguf_path)]
    code, out, _ = run(monkeypatch, capsys, *args, "--json")
    first = json.loads(out)
    assert code == 0 and [r["status"] for r in first] == ["new", "new version"]
    code, out, _ = run(monkeypatch, capsys, *args, "--json")
    assert [r["status"] for r in json.loads(out)] == ["unchanged", "unchanged"]
    code, out, _ = run(monkeypatch, capsys, "rag", "docs", "--db", db, "--json")
    rows = json.loads(out)
    assert [r["version"] for r in rows] == [1, 2]
    assert all(r["chunks"] >= 4 for r in rows)


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["rag", "ingest", "missing-folder"], "does not exist"),
        (["rag", "ingest", ".", "--chunk-tokens", "4"], "--chunk-tokens must be at least 8"),
        (["rag", "ingest", ".", "--overlap-tokens", "40"], "--overlap-tokens must be"),
        (["rag", "ask", "q", "--k", "0"], "--k and --max-tokens must be at least 1"),
        (["rag", "ask", "q", "--order", "random"], "--order 'random' is unknown"),
        (["rag", "ask", "q", "--as-of", "last week"], "YYYY-MM-DD"),
        (["rag", "ask", "q", "--retriever", "sparse"], "retriever 'sparse' is unknown"),
        (["rag", "eval", "--k", "1,x"], "comma-separated whole numbers"),
        (["rag", "eval", "--k", "0"], "at least 1"),
        (["rag", "eval", "--retriever", "bm25,sparse"], "retriever 'sparse' is unknown"),
        (["rag", "eval", "--backend", "openai"], "needs --tokenizer"),
        (["rag", "eval", "--price-input", "-1"], "price"),
        (["rag", "eval", "."], "needs its gold questions"),
        (["rag", "eval", "--questions", "q.jsonl"], "needs the corpus"),
        (["rag", "ask", "q", "--threads", "0"], "--threads must be at least 1"),
        (["rag", "eval", "--threads", "0"], "--threads must be at least 1"),
        (["rag", "ask", "q", "--metadata", "sometimes"], "--metadata 'sometimes' is unknown"),
        (["rag", "eval", "--metadata", "sometimes"], "--metadata 'sometimes' is unknown"),
    ],
)
def test_bad_input_is_one_sentence(monkeypatch, capsys, tmp_path, args, phrase):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(monkeypatch, capsys, *args)
    assert code == 2, (out, err)
    assert phrase in err and "Traceback" not in err
    assert err.startswith("error: ") and err.count("\n") == 1


_ASK_THROUGH_A_SERVER = """
import json, sys
from ctxlab.cli import main
sys.argv = ["ctxlab", "rag", "ask", "Who leads Acme Foundry?", "--db", sys.argv[1], "--json",
            "--backend", "openai", "--base-url", sys.argv[2]]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
heavy = sorted(m for m in ("torch", "transformers", "wordllama", "numpy") if m in sys.modules)
print(json.dumps({"heavy": heavy}))
"""


def test_ask_through_a_server_times_its_phases_and_imports_no_model(tmp_path, server):
    """`rag ask --backend openai` answers through a running server: the process imports no
    torch, transformers, numpy or embedding library (BM25 needs none), and `--json` reports each
    phase, so its cost beyond the model call can be measured."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from memory_fakes import WordBackend

    from ctxlab.memory.embed import WordLlamaEmbedder
    from ctxlab.memory.store import open_store
    from ctxlab.rag.documents import ingest
    from ctxlab.rag.readers import SourceDoc

    db = tmp_path / "rag.db"
    with open_store(db) as store:
        doc = SourceDoc("acme", "Acme Foundry is led by Ada Stone.", "2020-01-01", "Acme", "a1")
        ingest(store, doc, WordBackend(), WordLlamaEmbedder(), 64, 4)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    res = subprocess.run(
        [sys.executable, "-c", _ASK_THROUGH_A_SERVER, str(db), url],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    answer, after = json.loads("\n".join(lines[:-1])), json.loads(lines[-1])
    assert after["heavy"] == []
    assert answer["answer"] == "Done. [remembered]"
    assert set(answer["seconds"]) == {"retrieval", "model_load", "model_call"}
    assert all(s >= 0 for s in answer["seconds"].values())
    assert [p for p, _ in server.requests] == ["/v1/chat/completions"]
