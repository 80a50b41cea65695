"""`ctxlab memory` as a user runs it: the store commands, and bad input as one sentence."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import run_in_process


def run(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    r = run_in_process(monkeypatch, capsys, *args)
    return r.code, r.out, r.err


def test_fixture_import_search_core_tools(monkeypatch, capsys, tmp_path):
    db = str(tmp_path / "m.db")
    code, out, _ = run(monkeypatch, capsys, "memory", "fixture", "--out", str(tmp_path / "fx"))
    assert code == 0 and "history.jsonl" in out
    code, out, _ = run(
        monkeypatch, capsys, "memory", "import", str(tmp_path / "fx/history.jsonl"), "--db", db
    )
    assert code == 0 and "stored 108 messages" in out
    facts = json.loads((tmp_path / "fx/facts.json").read_text())
    code, out, _ = run(
        monkeypatch,
        capsys,
        "memory",
        "search",
        facts[1]["question"],
        "--db",
        db,
        "--json",
        "--role",
        "user",
        "--retriever",
        "bm25",
    )
    hits = json.loads(out)
    assert code == 0 and facts[1]["answer"] in hits[0]["text"]
    assert {h["role"] for h in hits} == {"user"}
    code, out, _ = run(
        monkeypatch, capsys, "memory", "core", "--set", "human=Name: Ada", "--db", db, "--json"
    )
    assert json.loads(out)[0]["value"] == "Name: Ada"
    code, out, _ = run(monkeypatch, capsys, "memory", "tools")
    assert json.loads(out)[0]["function"]["name"] == "core_memory_append"


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["memory", "compact", "--threads", "0"], "--threads must be at least 1"),
        (["memory", "compact", "--strategy", "magic"], "strategy 'magic' is unknown"),
        (["memory", "compact", "--history", "h.jsonl"], "give both --history and --facts"),
        (["memory", "compact", "--window", "64", "--reserve", "64"], "output reserve"),
        (["memory", "compact", "--backend", "openai"], "needs --base-url"),
        (["memory", "compact", "--retriever", "sparse"], "retriever 'sparse' is unknown"),
        (["memory", "search", "x", "--tier", "attic"], "--tier 'attic' is unknown"),
        (["memory", "search", "x", "--since", "March"], "YYYY-MM-DD"),
        (["memory", "core", "--set", "novalue"], "LABEL=TEXT"),
    ],
)
def test_bad_input_is_one_sentence(monkeypatch, capsys, tmp_path, args, phrase):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(
        monkeypatch, capsys, *args, *(["--db", "m.db"] if args[1] in ("search", "core") else [])
    )
    assert code == 2, (out, err)
    assert phrase in err and "Traceback" not in err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_unusable_db_paths(monkeypatch, capsys, tmp_path):
    (tmp_path / "dir.db").mkdir()
    (tmp_path / "junk.db").write_bytes(b"\x00junk" * 300)
    for path, phrase in (
        (tmp_path / "dir.db", "is a directory"),
        (tmp_path / "junk.db", "not a ctxlab database"),
    ):
        code, _, err = run(monkeypatch, capsys, "memory", "search", "x", "--db", str(path))
        assert code == 2 and phrase in err and err.count("\n") == 1
    assert (tmp_path / "junk.db").read_bytes() == b"\x00junk" * 300


def test_compact_end_to_end_against_a_server(monkeypatch, capsys, tmp_path, server):
    """Every strategy through the real command, the model behind real HTTP (a fake server)."""
    url = f"http://127.0.0.1:{server.server_port}/v1"
    code, out, err = run(
        monkeypatch,
        capsys,
        "memory",
        "compact",
        "--backend",
        "openai",
        "--base-url",
        url,
        "--window",
        "600",
        "--json",
        "--out",
        str(tmp_path / "c"),
    )
    assert code == 0, err
    doc = json.loads(out)
    rows = {r["strategy"]: r for r in doc["compaction"]}
    assert set(rows) == {"truncation", "summary-extractive", "summary", "tiered"}
    for row in rows.values():
        assert row["in_context"] + row["recoverable"] + row["lost"] == 10
        assert row["tokens_after"] <= 600 - 64 < row["tokens_before"]
        assert row["compactions"] >= 1
    assert rows["summary-extractive"]["in_context"] > rows["truncation"]["in_context"]
    assert (tmp_path / "c" / "compaction.json").is_file()
    assert (tmp_path / "c" / "compaction.png").stat().st_size > 10_000
    assert "deterministic" in doc["loop"]
    summaries = [b for p, b in server.requests if "Summary so far" in json.dumps(b)]
    assert summaries  # the model-written summary was asked for, recursively
