"""Writes that fail: a full disk, a read-only file system, a file where a folder goes.

One class, one helper (`ctxlab.outputs`): where results go is checked before the work
starts, a write is whole or absent (a temporary name renamed when complete), and a failure
is one sentence naming the path and the errno's meaning. Tests run as root here, where
`chmod` does not stop a write, so a read-only mount is simulated by making the creation of
a file under the folder raise EROFS (what the kernel answers on a read-only mount), and a
full disk by making the write itself raise ENOSPC after part of the bytes went out.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlab.outputs as outputs
from ctxlab.errors import CtxlabError


def _oserror(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@pytest.fixture
def read_only(monkeypatch):
    """`read_only(folder)`: creating a file under `folder` raises EROFS from now on."""
    real = outputs.tempfile.mkstemp
    frozen: list[Path] = []

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and any(Path(dir).resolve().is_relative_to(f) for f in frozen):
            raise _oserror(errno.EROFS)
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(outputs.tempfile, "mkstemp", mkstemp)
    return lambda folder: frozen.append(Path(folder).resolve())


def _full_disk_after(monkeypatch, written: int) -> None:
    """Every write through `outputs` stores `written` bytes, then the disk is full."""

    def fill(path: Path, data: bytes) -> None:
        with open(path, "wb") as handle:
            handle.write(data[:written])
        raise _oserror(errno.ENOSPC)

    monkeypatch.setattr(outputs, "_fill", fill)


def _full_disk_for_figures(monkeypatch) -> None:
    from matplotlib.figure import Figure

    def savefig(self, fname, **kwargs):
        Path(fname).write_bytes(b"\x89PNG\r\n\x1a\n half")
        raise _oserror(errno.ENOSPC)

    monkeypatch.setattr(Figure, "savefig", savefig)


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# -- the helper ------------------------------------------------------------------------------


@given(
    old=st.binary(max_size=64),
    new=st.binary(max_size=256),
    cut=st.none() | st.integers(min_value=0, max_value=300),
)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_a_write_is_whole_or_absent_never_half(tmp_path, monkeypatch, old, new, cut):
    path = tmp_path / "result.json"
    path.write_bytes(old)
    with monkeypatch.context() as m:
        if cut is not None:
            _full_disk_after(m, cut)
        try:
            outputs.write_bytes(path, new, "--out")
        except CtxlabError as exc:
            assert cut is not None
            assert str(exc).startswith(f"--out {path} cannot be written: No space left")
            assert "(ENOSPC)" in str(exc)
            assert path.read_bytes() == old  # the old result stays, whole
        else:
            assert cut is None and path.read_bytes() == new
    assert _left(tmp_path) == ["result.json"]  # no temporary file left behind


def test_a_figure_cut_short_leaves_no_file(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, _ = plt.subplots()
    _full_disk_for_figures(monkeypatch)
    with pytest.raises(CtxlabError, match=r"kv\.png cannot be written: No space left on device"):
        outputs.save_figure(fig, tmp_path / "kv.png")
    plt.close(fig)
    assert _left(tmp_path) == []


def test_a_read_only_folder_is_found_by_the_up_front_check(tmp_path, read_only):
    read_only(tmp_path)
    with pytest.raises(CtxlabError, match=r"Read-only file system \(EROFS\)"):
        outputs.check_folder(tmp_path / "out")
    with pytest.raises(CtxlabError, match=r"Read-only file system \(EROFS\)"):
        outputs.check_file(tmp_path / "out" / "x.json")


def test_a_file_where_a_folder_goes_is_named(tmp_path):
    (tmp_path / "results").write_text("a file")
    with pytest.raises(CtxlabError, match="results is a file; give a folder"):
        outputs.check_folder(tmp_path / "results")
    with pytest.raises(CtxlabError, match="results is a file, not a folder"):
        outputs.check_folder(tmp_path / "results" / "deeper")


# -- every command: found before the work, or one sentence after it ---------------------------


def _never(*_args, **_kwargs):
    raise AssertionError("the work started although its results could not be written")


@pytest.mark.parametrize(
    ("args", "work"),
    [
        (["plan", "llama-3.1-8b", "--plot", "{ro}/kv.png"], None),
        (["simulate", "synthetic:n=5", "llama-3.1-8b", "--out", "{ro}/sim"],
         "ctxlab.sim.run.simulate"),
        (["bench", "serve", "--base-url", "http://127.0.0.1:9", "--out", "{ro}/bench",
          "--model", "m", "--num-prompts", "2"], "ctxlab.bench.serve.run_bench"),
        (["probe", "--server", "http://127.0.0.1:9", "--out", "{ro}/probe.json"],
         "ctxlab.probe.runner.run"),
        (["tour", "--no-model", "--out", "{ro}/tour"], None),
        (["workshop", "--quick", "--out", "{ro}/ws"], "ctxlab.workshop.runner.run_workshop"),
        (["rag", "ingest", "{docs}", "--db", "{ro}/rag.db"],
         "ctxlab.memory.embed.WordLlamaEmbedder"),
        (["export-hf", "smollm2-135m", "--out", "{ro}/hf"], "ctxlab.hf.gguf.from_gguf"),
    ],
)  # fmt: skip
def test_a_read_only_destination_is_refused_before_the_work(
    cli, tmp_path, read_only, monkeypatch, args, work
):
    ro = tmp_path / "ro"
    ro.mkdir()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nSome text to ingest.\n")
    read_only(ro)
    if work is not None:
        module, _, name = work.rpartition(".")
        monkeypatch.setattr(f"{module}.{name}", _never)
    r = cli(*[a.format(ro=ro, docs=docs) for a in args])
    assert r.code == 2, (r.out, r.err)
    assert len(r.err_lines) == 1, r.err
    assert "Read-only file system (EROFS)" in r.err and str(ro) in r.err
    assert [p for p in ro.rglob("*") if not p.is_dir()] == []  # (the fake mount allows mkdir)


def test_plan_plot_on_a_full_disk_is_one_sentence_and_no_file(cli, tmp_path, monkeypatch):
    _full_disk_for_figures(monkeypatch)
    r = cli("plan", "llama-3.1-8b", "--plot", str(tmp_path / "kv.png"))
    assert r.code == 2
    assert r.err_lines == [
        f"error: {tmp_path / 'kv.png'} cannot be written: No space left on device (ENOSPC); "
        "free some space or choose another folder."
    ]
    assert _left(tmp_path) == []


def test_simulate_on_a_full_disk_leaves_no_plot(cli, tmp_path, monkeypatch):
    _full_disk_for_figures(monkeypatch)
    r = cli("simulate", "synthetic:n=5", "llama-3.1-8b", "--out", str(tmp_path / "sim"))
    assert r.code == 2 and len(r.err_lines) == 1, r.err
    assert "No space left on device (ENOSPC)" in r.err
    assert _left(tmp_path / "sim") == []


def test_an_unwrapped_write_on_a_full_disk_is_still_one_sentence(cli, monkeypatch):
    """The CLI's last net: ENOSPC from any write, wrapped or not, is not a traceback."""

    def build(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/somewhere/result.json")

    monkeypatch.setattr("ctxlab.plan.report.build_plan", build)
    r = cli("plan", "llama-3.1-8b")
    assert r.code == 2
    assert r.err_lines == [
        "error: /somewhere/result.json cannot be written: No space left on device (ENOSPC); "
        "free some space or choose another folder."
    ]


def test_rag_ingest_on_a_full_disk_keeps_nothing_of_the_batch(cli, tmp_path, monkeypatch):
    """A store that cannot grow (SQLite's max_page_count: SQLITE_FULL, as a full disk gives)
    rolls the batch back and says so in one sentence."""
    import ctxlab.memory.store as store

    docs = tmp_path / "docs"
    docs.mkdir()
    words = " ".join(f"word{i} fact{i % 17} about the launch." for i in range(3000))
    (docs / "long.md").write_text(f"# Long\n\n{words}\n")
    real = store.sqlite3.connect

    def small(*args, **kwargs):
        conn = real(*args, **kwargs)
        conn.execute("PRAGMA max_page_count = 60")
        return conn

    monkeypatch.setattr(store.sqlite3, "connect", small)
    db = tmp_path / "rag.db"
    r = cli("rag", "ingest", str(docs), "--db", str(db))
    assert r.code == 2, (r.out, r.err)
    errors = [line for line in r.err_lines if not line.startswith("ingesting")]  # progress
    assert len(errors) == 1 and "database or disk is full" in errors[0], r.err
    assert "nothing of this write was kept" in errors[0]
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT COUNT(*) FROM documents").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == 0
    conn.close()


def test_the_workshop_report_on_a_full_disk_keeps_the_older_report_whole(tmp_path, monkeypatch):
    """The workshop writes results.json and the reports through the helper: a full disk
    is one sentence, and an older run's report in the folder stays whole (not truncated)."""
    from ctxlab.workshop.runner import write_reports

    old = tmp_path / "results.json"
    old.write_text('{"an": "older run"}\n')
    _full_disk_after(monkeypatch, 5)
    with pytest.raises(CtxlabError, match=r"results\.json cannot be written: No space left"):
        write_reports({"status": "complete"}, tmp_path)
    assert old.read_text() == '{"an": "older run"}\n'
    assert _left(tmp_path) == ["results.json"]


@given(
    mask=st.sampled_from([0o022, 0o002, 0o077, 0o027]), before=st.sampled_from([None, 0o640, 0o604])
)
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_a_written_file_has_the_permissions_a_plain_write_gives(tmp_path, mask, before):
    """Whole-or-absent writes go through a temporary file, which is created 0600; renamed
    as it was, every report, results.json and plot was readable by its owner alone. A new
    file gets 0666 less the umask, a replaced one keeps its mode."""
    path = tmp_path / f"r-{mask:o}-{before}.json"
    path.unlink(missing_ok=True)
    if before is not None:
        path.write_text("old", encoding="utf-8")
        os.chmod(path, before)
    old = os.umask(mask)
    try:
        outputs.write_text(path, "{}")
    finally:
        os.umask(old)
    expected = before if before is not None else 0o666 & ~mask
    assert path.stat().st_mode & 0o777 == expected
    assert path.read_text(encoding="utf-8") == "{}"


@pytest.mark.parametrize("command", ["rag", "memory"])
def test_a_new_store_whose_schema_does_not_fit_names_the_full_disk(cli, tmp_path, monkeypatch,
                                                                   command):  # fmt: skip
    """The disk fills while a new store's tables are created: the sentence says the disk is
    full (it said "cannot rollback - no transaction is active": SQLite had rolled back on
    SQLITE_FULL, and a second ROLLBACK raised over the real error)."""
    import ctxlab.memory.store as store

    real = store.sqlite3.connect

    class DiskFills:
        """A connection on a disk that fills at the first CREATE: SQLite answers SQLITE_FULL
        and has rolled the transaction back (what a full disk does to a journal write)."""

        def __init__(self, conn: sqlite3.Connection) -> None:
            self._conn = conn

        def __getattr__(self, name: str) -> object:
            return getattr(self._conn, name)

        def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
            if sql.lstrip().upper().startswith("CREATE"):
                self._conn.execute("ROLLBACK")
                raise sqlite3.OperationalError("database or disk is full")
            return self._conn.execute(sql, *args)

    monkeypatch.setattr(store.sqlite3, "connect", lambda *a, **k: DiskFills(real(*a, **k)))
    db = tmp_path / "new.db"
    source = tmp_path / "in.md"
    source.write_text("# A\n\nThe launch moved to March.\n", encoding="utf-8")
    if command == "rag":
        r = cli("rag", "ingest", str(source), "--db", str(db))
    else:
        history = tmp_path / "history.jsonl"
        history.write_text('{"role": "user", "content": "hello"}\n', encoding="utf-8")
        r = cli("memory", "import", str(history), "--db", str(db))
    assert r.code == 2, (r.out, r.err)
    assert len(r.err_lines) == 1 and "database or disk is full" in r.err, r.err
    assert "no transaction" not in r.err


@pytest.mark.parametrize("command", ["rag", "memory"])
def test_a_fixture_on_a_full_disk_names_the_file(cli, tmp_path, monkeypatch, command):
    """`rag fixture` and `memory fixture` write through the helper: a full disk names the
    file and leaves no half file (the CLI's last net said "a result file cannot be
    written", no path)."""
    _full_disk_after(monkeypatch, 5)
    out = tmp_path / "fx"
    r = cli(command, "fixture", "--out", str(out))
    assert r.code == 2, (r.out, r.err)
    assert len(r.err_lines) == 1 and f"error: {out}/" in r.err, r.err
    assert "No space left on device (ENOSPC)" in r.err
    assert [p for p in out.rglob("*") if p.is_file()] == []
