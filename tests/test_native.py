"""`ctxlab.native`: C built once per machine into the cache, loaded from it after, and a clear
None (with its reason) where it cannot be built; a real compiler on a real file."""

from __future__ import annotations

import ctypes
import subprocess

import pytest

from ctxlab import native
from ctxlab.kv import row_write
from ctxlab.model import elementwise, gemv, norm_kernel

SOURCE = "int twice(int x) { return 2 * x; }\n"


def declare(lib: ctypes.CDLL) -> None:
    lib.twice.argtypes = [ctypes.c_int]
    lib.twice.restype = ctypes.c_int


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache folder and no library loaded yet in this process."""
    monkeypatch.setenv("CTXLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "_why_not", {})
    src = tmp_path / "twice.c"
    src.write_text(SOURCE)
    return src


needs_cc = pytest.mark.skipif(native.compiler() is None, reason="no C compiler here")


@needs_cc
def test_builds_once_then_loads_from_the_cache(fresh, monkeypatch):
    lib = native.load(fresh, declare)
    assert lib is not None and lib.twice(21) == 42
    built = list((fresh.parent / "cache" / "native").glob("twice-*.so"))
    assert len(built) == 1
    # another process (a cleared in-process table) loads the file without compiling
    monkeypatch.setattr(native, "_loaded", {})
    calls = []
    real = subprocess.run

    def spy(cmd, *a, **kw):
        calls.append(cmd)
        return real(cmd, *a, **kw)

    monkeypatch.setattr(native.subprocess, "run", spy)
    again = native.load(fresh, declare)
    assert again is not None and again.twice(5) == 10
    assert not any("-shared" in c for c in calls)  # only `cc --version` for the key


@needs_cc
def test_a_changed_source_builds_its_own_copy(fresh, monkeypatch):
    assert native.load(fresh, declare) is not None
    fresh.write_text(SOURCE + "int thrice(int x) { return 3 * x; }\n")
    monkeypatch.setattr(native, "_loaded", {})
    assert native.load(fresh, declare) is not None
    assert len(list((fresh.parent / "cache" / "native").glob("twice-*.so"))) == 2


def test_off_gives_none_and_says_why(fresh, monkeypatch):
    monkeypatch.setenv(native.ENV, "off")
    assert native.load(fresh, declare) is None
    assert native.why_not("twice") == f"{native.ENV}=off"


def test_without_a_compiler_gives_none(fresh, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    assert native.compiler() is None
    assert native.load(fresh, declare) is None
    assert "no C compiler" in native.why_not("twice")


@needs_cc
def test_a_source_that_does_not_compile_gives_none(fresh, caplog):
    fresh.write_text("int twice(int x) { return 2 * ; }\n")
    assert native.load(fresh, declare) is None
    assert native.why_not("twice").startswith("building it failed")
    assert "its torch path runs" in caplog.text
    assert not list((fresh.parent / "cache" / "native").glob("*.so"))  # nothing half-written


@needs_cc
def test_a_library_without_the_declared_function_gives_none(fresh):
    def wants_more(lib: ctypes.CDLL) -> None:
        lib.missing.restype = ctypes.c_int

    assert native.load(fresh, wants_more) is None
    assert "lacks a function" in native.why_not("twice")


# ctxlab's compiled libraries: (name, loader). Each one's own tests skip where it is not
# built, so this is what fails when a machine with a compiler did not build one.
LIBRARIES = [
    ("gemv", gemv.kernels),
    ("rms_norm", norm_kernel.kernel),
    ("elementwise", elementwise.kernel),
    ("row_write", row_write.kernel),
]


@pytest.mark.isa  # the second instruction set builds them again, one level lower
@pytest.mark.parametrize(("name", "load"), LIBRARIES, ids=[n for n, _ in LIBRARIES])
def test_each_library_builds_where_there_is_a_compiler(name, load):
    if native.compiler() is None or not native.enabled():
        pytest.skip("no C compiler here, or CTXLAB_NATIVE=off")
    assert load() is not None, native.why_not(name)
