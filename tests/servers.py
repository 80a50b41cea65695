"""Real servers on loopback, and the two the whole test session shares.

Starting a server costs seconds (a process, a model load, for llama.cpp a context), so every
test that only reads from one asks for the session's `ctxlab_server` or `llamacpp_server`
(exposed by tests/conftest.py) and marks itself `xdist_group(SHARED)`, which keeps those
tests on one pytest-xdist worker: one start per session, not one per worker. The probe and
the workshop draw fresh random prompts on every run, so what one test left in a shared cache
never answers another's question; filling the cache (the probe's capacity section,
demonstration 4) only evicts, least recently used first, what no later test reads back. A
test whose answer depends on the server's state (flags other than these, tenants, /metrics
counters that must count only its own requests, a pool sized to its load, a process it
kills) starts its own with `ctxlab_serve(...)` or `llamacpp_serve(...)` and says why.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]

SHARED = "servers"  # the xdist_group of every test that uses a shared server

# The shared `ctxlab serve`: 32-token pages (not the default 16, so a test sees whether a
# client measured the server's page or assumed its own), a pool small enough to fill in a
# few requests, and vLLM's metric names (what the probe reads the published pool from).
CTXLAB_PAGE = 32
CTXLAB_POOL = 1024
CTXLAB_ARGS = ("--page-size", str(CTXLAB_PAGE), "--kv-pool-tokens", str(CTXLAB_POOL),
               "--metrics-prefix", "vllm")  # fmt: skip

# The shared llama.cpp server: 2 slots over a 4096-token context, no prompt cache in RAM
# (a slot keeps one prompt: the cache nobody here wrote).
LLAMACPP_SLOTS = 2
LLAMACPP_CTX = 4096


@contextlib.contextmanager
def ctxlab_serve(
    *args: str, timeout: float = 180.0, while_starting: Callable[[], object] | None = None
) -> Iterator[str]:
    """Start `ctxlab serve --port 0 ARGS`; yield its base URL; stop it at the end.

    `while_starting` runs while the server loads its model (e.g. the test's own model load:
    two processes load in parallel on two cores)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    main = "from ctxlab.cli import main; main()"
    cmd = [sys.executable, "-c", main, "serve", "--port", "0", "--threads", "1", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    try:
        if while_starting is not None:
            while_starting()
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("ready "):
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"ctxlab serve did not start: {line!r} {err[-2000:]}")
        url = line.split()[1]
        wait_healthy(url, proc, timeout, "ctxlab serve")
        yield url
    finally:
        stop(proc)


_LLAMACPP = """
import sys, time, socket, xllamacpp
path, parallel, ctx, ram = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
p = xllamacpp.CommonParams()
p.model.path = path
p.port = port
p.n_parallel = parallel
p.n_ctx = ctx
p.cache_ram_mib = ram
p.cpuparams.n_threads = 1
p.cpuparams_batch.n_threads = 1
p.endpoint_metrics = True
server = xllamacpp.Server(p)
print(f"ready http://127.0.0.1:{port}", flush=True)
while True:
    time.sleep(3600)
"""


@contextlib.contextmanager
def llamacpp_serve(parallel: int = 2, ctx: int = 4096, cache_ram_mib: int = 0) -> Iterator[str]:
    """llama.cpp's server on the default GGUF, on a free loopback port; yield its URL."""
    pytest.importorskip("xllamacpp")
    from ctxlab.model.registry import DEFAULT_MODEL, REGISTRY, packaged_path

    gguf = str(packaged_path(REGISTRY[DEFAULT_MODEL]))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", _LLAMACPP, gguf, str(parallel), str(ctx), str(cache_ram_mib)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("ready "):
            raise RuntimeError(f"llama.cpp's server did not start: {line!r}")
        url = line.split()[1]
        wait_healthy(url, proc, 120, "llama.cpp's server")
        yield url
    finally:
        stop(proc)


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float, what: str) -> None:
    """Poll `url`/health until it answers 200; RuntimeError if `proc` dies or time runs out."""
    end = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"{what} did not become healthy")
        time.sleep(0.1)


def stop(proc: subprocess.Popen) -> None:
    """Terminate a server process, killing it if it does not exit within 20 s."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def installed(command: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`ctxlab COMMAND ARGS` through the installed script, in its own process (as a user's
    shell runs it): serve, probe and workshop keep one such smoke test each; the rest of
    their tests run in-process through the CLI's own entry point."""
    script = Path(sys.executable).parent / "ctxlab"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(script), command, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def free_port() -> int:
    """A loopback port nobody listens on now (for a server or a publisher to bind)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Served:
    """The session's `ctxlab serve`: its base URL and its KV-event publisher (vLLM's format),
    which the workshop's demonstration 4 reads its evictions from."""

    url: str
    kv_events: str


@pytest.fixture(scope="session")
def ctxlab_served(gguf_path: Path) -> Iterator[Served]:
    """The session's `ctxlab serve` (`CTXLAB_ARGS`, publishing its KV events on loopback),
    for tests that only read from it."""
    events = f"tcp://127.0.0.1:{free_port()}"
    with ctxlab_serve(*CTXLAB_ARGS, "--kv-events-endpoint", events) as url:
        yield Served(url, events)


@pytest.fixture(scope="session")
def ctxlab_server(ctxlab_served: Served) -> str:
    """The session's `ctxlab serve`'s base URL."""
    return ctxlab_served.url


@pytest.fixture(scope="session")
def llamacpp_server(gguf_path: Path) -> Iterator[str]:
    """The session's llama.cpp server (`LLAMACPP_SLOTS` slots, `LLAMACPP_CTX` context)."""
    with llamacpp_serve(parallel=LLAMACPP_SLOTS, ctx=LLAMACPP_CTX, cache_ram_mib=0) as url:
        yield url
