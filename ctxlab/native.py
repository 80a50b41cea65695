"""C kernels compiled once per machine for its own CPU, cached, loaded with ctypes.

A few loops (decode-sized matrix products, the paged decode attention) run faster as C built
with `-march=native` than through torch's operators or numba: they are memory-bound at one to
eight rows, and only a loop written for that keeps the memory busy (docs/decode.md). Building
needs a C compiler (`$CC`, else `cc`, `gcc` or `clang`); the result goes to
`<cache>/native/<name>-<key>.so`, where the key covers the source, the compiler, the flags and
the CPU's feature flags, so a changed source or another CPU builds its own copy and every
later process only loads it (milliseconds). The first build prints one progress line (about a
second or two per file).

Without a compiler, with a failed build, or with `CTXLAB_NATIVE=off`, `load` returns None and
logs why once; every caller has a torch or numba path that computes the same thing.
Nothing here imports torch.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from ctxlab.cache_dir import cache_root
from ctxlab.progress import progress

log = logging.getLogger("ctxlab.native")

ENV = "CTXLAB_NATIVE"  # "off" (or 0/no/false) keeps every kernel on its torch/numba path
# The -march the kernels are built for: "native" (default), or a lower level such as
# x86-64-v3 (AVX2) or x86-64-v2, which `tests/second_isa.py` sets to test those loops too.
MARCH_ENV = "CTXLAB_NATIVE_MARCH"
# No -ffast-math: with -shared some compilers link an object that flushes denormals to zero
# for the whole process. Reassociation and contraction are what the loops need.
FLAGS = (
    "-O3",
    "-std=gnu11",
    "-fPIC",
    "-shared",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fno-signed-zeros",
    "-fassociative-math",
    "-ffp-contract=fast",
)
BUILD_SECONDS = 180

_loaded: dict[tuple[str, tuple[str, ...]], ctypes.CDLL | None] = {}
_why_not: dict[str, str] = {}


def enabled() -> bool:
    """Whether native kernels may be used at all (`CTXLAB_NATIVE` is not off)."""
    return os.environ.get(ENV, "on").strip().lower() not in ("off", "0", "no", "false")


def compiler() -> str | None:
    """The C compiler to build with: `$CC`, else the first of cc, gcc, clang on PATH."""
    named = os.environ.get("CC")
    if named:
        return shutil.which(named) or named
    return next((p for c in ("cc", "gcc", "clang") if (p := shutil.which(c))), None)


@functools.cache
def cpu_flags() -> str:
    """The CPU's feature flags (what -march=native compiles for), for the cache key; read
    once per process."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    return cache_root() / "native"


@functools.cache
def _compiler_version(cc: str) -> str:
    """The first line of `cc --version` (asked once per process and compiler)."""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return next(iter(out.stdout.splitlines()), "")


def _key(source: bytes, cc: str, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for part in (source, cc.encode(), " ".join(flags).encode(), _compiler_version(cc).encode()):
        digest.update(part + b"\0")
    digest.update(cpu_flags().encode())
    return digest.hexdigest()[:20]


def address(fn: Callable[..., object]) -> int:
    """A loaded library function's address, for compiled code that calls it through a
    pointer (`decode_block.c`)."""
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


def why_not(name: str) -> str:
    """Why `load(name)` gave None ("" when it loaded or was not asked for)."""
    return _why_not.get(name, "")


def load(source: Path, setup: Callable[[ctypes.CDLL], None]) -> ctypes.CDLL | None:
    """The compiled `source` (built on the first call on this machine), with `setup` run on
    it once to declare its functions' argument types; None when native kernels are off or
    it cannot be built here (logged once, with the reason in `why_not`)."""
    name = source.stem
    march = os.environ.get(MARCH_ENV, "").strip() or "native"
    flags = (f"-march={march}", *FLAGS)
    if (name, flags) in _loaded:
        return _loaded[(name, flags)]
    lib = _build_and_load(source, flags)
    if lib is not None:
        try:
            setup(lib)
        except AttributeError as exc:  # a stale or foreign library without the functions
            lib = _refuse(name, f"the built library lacks a function ({exc})")
    _loaded[(name, flags)] = lib
    return lib


def _refuse(name: str, why: str, level: int = logging.WARNING) -> None:
    """Record and log once why `name` is not loaded; its callers run their torch path."""
    _why_not[name] = why
    log.log(level, "native %s: %s; its torch path runs", name, why)


def _build_and_load(source: Path, flags: tuple[str, ...]) -> ctypes.CDLL | None:
    name = source.stem
    if not enabled():
        return _refuse(name, f"{ENV}=off", logging.INFO)
    cc = compiler()
    if cc is None:
        return _refuse(name, "no C compiler (cc, gcc or clang) on PATH", logging.INFO)
    target = _cache_dir() / f"{name}-{_key(source.read_bytes(), cc, flags)}.so"
    if not target.is_file():
        try:
            _build(source, cc, flags, target)
        except (OSError, subprocess.SubprocessError) as exc:
            return _refuse(name, f"building it failed ({_first_line(exc)})")
    try:
        return ctypes.CDLL(str(target))
    except OSError as exc:
        return _refuse(name, f"loading {target} failed ({exc})")


def _build(source: Path, cc: str, flags: tuple[str, ...], target: Path) -> None:
    """Compile into a temporary file beside `target`, then rename it into place (atomic:
    two processes building at once each finish with a whole library)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        with progress(f"compiling {source.name} for this CPU (once; cached in {target.parent})"):
            done = subprocess.run(
                [cc, *flags, "-o", tmp, str(source), "-lm"],
                capture_output=True,
                text=True,
                timeout=BUILD_SECONDS,
            )
        if done.returncode != 0:
            raise subprocess.SubprocessError(done.stderr.strip() or f"exit {done.returncode}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
