"""Inputs that are not regular files: FIFOs, link loops, directories, undecodable names.

One class, one check (`ctxlab.inputs.check_input_file`): every such path is one sentence
that says what the path is instead, printed with escapes, in bounded time. A FIFO with no
writer would block an `open()` forever, so each FIFO case runs under an alarm that turns a
hang into a failure instead of a stuck test run.
"""

from __future__ import annotations

import os
import re
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_input_file, read_text, shown


class _Hung(Exception):
    pass


@contextmanager
def bounded(seconds: int = 20):
    """Fail (not hang) when the body blocks, e.g. on a FIFO nobody writes."""

    def alarm(*_: object) -> None:
        raise _Hung(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def odd(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.txt"
    loop.symlink_to(loop)
    dangling = tmp_path / "gone.txt"
    dangling.symlink_to(tmp_path / "nowhere.txt")
    folder = tmp_path / "notes.txt"
    folder.mkdir()
    return {"fifo": fifo, "loop": loop, "dangling": dangling, "folder": folder}


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("fifo", "is a named pipe (FIFO), not a regular file"),
        ("loop", "is a symbolic link loop"),
        ("dangling", "is a symbolic link to"),
        ("folder", "is a directory"),
    ],
)
def test_a_path_that_is_not_a_regular_file_says_what_it_is(odd, key, said):
    for check in (check_input_file, read_text):
        with bounded(), pytest.raises(CtxlabError, match=re.escape(said)) as info:
            check(odd[key], "document")
        assert str(odd[key]) in str(info.value)


@given(st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\0" not in b))
@settings(max_examples=60, deadline=None)
def test_shown_names_are_printable_and_keep_every_byte(name):
    text = shown(name)
    assert text.isprintable()
    text.encode("utf-8")  # printable and encodable: a message with it can always be printed
    try:
        plain = name.decode("utf-8")
    except UnicodeDecodeError:
        plain = None
    if plain is not None and plain.isprintable():
        assert text == plain  # a printable UTF-8 name ("¡", "café") is shown as it is
    else:
        assert "\\" in text  # the odd bytes are escapes, not dropped or replaced silently


def test_a_name_that_is_not_utf8_is_shown_with_escapes(tmp_path):
    path = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9\n.txt"))
    with pytest.raises(CtxlabError) as info:
        read_text(path, "document")
    assert "caf\\xe9\\n.txt does not exist" in str(info.value)


def test_simulate_refuses_a_fifo_trace_without_waiting(cli, odd):
    with bounded():
        r = cli("simulate", str(odd["fifo"]), "llama-3.1-8b")
    assert r.code == 2, r.err
    assert r.err_lines == [f"error: trace {odd['fifo']} is a named pipe (FIFO), not a regular "
                           "file; give a .jsonl or .csv file."]  # fmt: skip


@pytest.mark.parametrize("key", ["fifo", "loop", "dangling"])
def test_rag_ingest_refuses_what_is_not_a_document_before_writing(cli, odd, tmp_path, key):
    with bounded():
        r = cli("rag", "ingest", str(odd[key]), "--db", str(tmp_path / "rag.db"))
    assert r.code == 2, r.err
    assert len(r.err_lines) == 1 and "Traceback" not in r.err
    assert not (tmp_path / "rag.db").exists()


def test_rag_ingest_refuses_a_fifo_named_like_text(cli, tmp_path):
    fifo = tmp_path / "a.txt"
    os.mkfifo(fifo)
    with bounded():
        r = cli("rag", "ingest", str(fifo), "--db", str(tmp_path / "rag.db"))
    assert r.code == 2
    assert "is a named pipe (FIFO)" in r.err


@pytest.mark.parametrize("odd_entry", ["fifo", "dangling"])
def test_rag_ingest_of_a_folder_names_what_is_not_a_document(cli, tmp_path, odd_entry):
    """A folder walk reads every entry named like a document: a FIFO or a dangling link
    named notes.txt is refused by name (it was skipped in silence: "1 new")."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.md").write_text("# A\n\nThe launch moved to March.\n", encoding="utf-8")
    if odd_entry == "fifo":
        os.mkfifo(folder / "notes.txt")
    else:
        (folder / "notes.txt").symlink_to(tmp_path / "gone.txt")
    with bounded():
        r = cli("rag", "ingest", str(folder), "--db", str(tmp_path / "rag.db"))
    assert r.code == 2, r.out
    said = "is a named pipe (FIFO)" if odd_entry == "fifo" else "which does not exist"
    assert len(r.err_lines) == 1 and "notes.txt" in r.err and said in r.err, r.err
    assert not (tmp_path / "rag.db").exists()


def test_rag_ingest_takes_a_file_whose_name_is_not_utf8(cli, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    raw = os.fsencode(folder) + b"/r\xe9sum\xe9.txt"
    with open(raw, "wb") as f:
        f.write(b"# Notes\n\nThe launch moved to March because the supplier was late.\n")
    r = cli("rag", "ingest", str(folder), "--db", str(tmp_path / "rag.db"), "--json")
    assert r.code == 0, r.err
    assert "r\\\\xe9sum\\\\xe9" in r.out  # the id keeps the bytes as escapes (JSON-escaped)


def test_rag_ingest_of_a_folder_skips_hidden_entries_and_says_so(cli, tmp_path):
    """An editor's lock (`.#notes.md`, a dangling link) and a `.git/` folder are not
    documents: the walk leaves them out and the summary counts them."""
    folder = tmp_path / "docs"
    (folder / ".git").mkdir(parents=True)
    (folder / "a.md").write_text("# A\n\nThe launch moved to March.\n", encoding="utf-8")
    (folder / ".#a.md").symlink_to(tmp_path / "user@host.1234")
    (folder / ".git" / "notes.txt").write_text("not a document\n", encoding="utf-8")
    with bounded():
        r = cli("rag", "ingest", str(folder), "--db", str(tmp_path / "rag.db"))
    assert r.code == 0, r.err
    assert "1 new" in r.out and "2 hidden entries (named with a leading dot) skipped" in r.out
