"""`memory import` on paths that are not regular files and on dates that are not dates, and the
compaction settings checked in the library (ctxlab/memory), not in the command."""

from __future__ import annotations

import os
import threading

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.memory.budget import MemoryConfig
from ctxlab.memory.compaction_run import CompactionSettings
from ctxlab.memory.messages import check_created_at, read_history
from tests.cli.conftest import run_in_process

LINE = '{"role": "user", "content": "hello", "created_at": "%s"}\n'


def _import(monkeypatch, capsys, path, tmp_path):
    return run_in_process(
        monkeypatch, capsys, "memory", "import", str(path), "--db", str(tmp_path / "m.db")
    )


def test_a_fifo_with_no_writer_is_refused_without_waiting(monkeypatch, capsys, tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    done: list[object] = []
    worker = threading.Thread(
        target=lambda: done.append(_import(monkeypatch, capsys, fifo, tmp_path)), daemon=True
    )
    worker.start()
    worker.join(30)
    if worker.is_alive():  # unblock the reader so the test process can end, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("memory import blocked on a FIFO with no writer")
    r = done[0]
    assert r.code != 0 and "named pipe (FIFO)" in r.err and "pipe.jsonl" in r.err
    assert "Traceback" not in r.err


def test_a_symlink_loop_and_a_directory_say_what_the_path_is(monkeypatch, capsys, tmp_path):
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    r = _import(monkeypatch, capsys, loop, tmp_path)
    assert r.code != 0 and "symbolic link loop" in r.err and "loop.jsonl" in r.err
    folder = tmp_path / "histories"
    folder.mkdir()
    r = _import(monkeypatch, capsys, folder, tmp_path)
    assert r.code != 0 and "is a directory" in r.err
    assert not (tmp_path / "m.db").exists()  # refused before the store opens


def test_a_name_with_control_characters_is_shown_escaped(tmp_path):
    odd = tmp_path / "a\nb.jsonl"
    odd.mkdir()
    with pytest.raises(CtxlabError) as err:
        read_history(odd)
    assert "a\\nb.jsonl" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["yesterday", "2024-13-01", "08/03/2024", "20240308"])
def test_import_refuses_a_created_at_that_is_not_a_date(monkeypatch, capsys, tmp_path, value):
    path = tmp_path / "h.jsonl"
    path.write_text(LINE % "2024-03-08" + LINE % value)
    r = _import(monkeypatch, capsys, path, tmp_path)
    assert r.code != 0
    assert f"message 1 of {path} has created_at {value!r}, which is not a date" in r.err
    assert len(r.err_lines) == 1


@pytest.mark.parametrize(
    "value", ["2024-03-08", "2024-03-08T09:30:00", "2024-03-08T09:30:00+00:00", "", None]
)
def test_dates_and_missing_dates_are_kept_as_given(value):
    assert check_created_at(value, "message 0") == (value or "")


def test_a_number_is_not_a_date():
    with pytest.raises(CtxlabError, match=r"message 4 of h\.jsonl has created_at 20240308"):
        check_created_at(20240308, "message 4 of h.jsonl")


def _settings(**kw):
    memory = MemoryConfig(window=kw.pop("window", 1024), reserve=64, retrieve_k=kw.pop("k", 3))
    return CompactionSettings(memory, kw.pop("strategies", ("truncation",)), **kw)


@pytest.mark.parametrize(
    ("kw", "phrase"),
    [
        ({"strategies": ("nope",)}, "strategy 'nope' is unknown"),
        ({"retriever": "grep"}, "retriever 'grep' is unknown"),
        ({"k": 0}, "--k and --answer-tokens must be at least 1"),
        ({"answer_tokens": 0}, "--k and --answer-tokens must be at least 1"),
        ({"answer_tokens": 65}, "--answer-tokens 65 exceeds --reserve 64"),
        ({"model_positions": 512}, "--window 1,024 is beyond the model's 512 positions"),
    ],
)
def test_compaction_settings_refuse_bad_values(kw, phrase):
    with pytest.raises(CtxlabError, match=phrase):
        _settings(**kw)


def test_compaction_settings_accept_good_values():
    s = _settings(answer_tokens=64, model_positions=1024, retriever="bm25")
    assert s.memory.budget == 960 and s.strategies == ("truncation",)
