"""Servers for the serving tests: a real `ctxlab serve` process on a free loopback port (one
per test module), or the app in a thread of this process over an engine a test built."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


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


@contextlib.contextmanager
def in_process(engine, **settings) -> Iterator[str]:
    """The app over `engine` in a thread of this process; yield its base URL."""
    from ctxlab.serve import ServeSettings, create_app
    from ctxlab.serve.server import start_in_thread

    app = create_app(engine, ServeSettings(**{"model_name": "m", **settings}))
    server, url = start_in_thread(app)
    try:
        yield url
    finally:
        server.should_exit = True
        server.thread.join(timeout=30)


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text exposition (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        series, _, lab = head.partition("{")
        if series != name:
            continue
        pairs = dict(p.split("=", 1) for p in lab.rstrip("}").split(",") if p)
        if all(pairs.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    return 0.0


@pytest.fixture(scope="session")
def serve_model() -> str:
    """Skip the serving tests when the default model is not installed."""
    from ctxlab.errors import CtxlabError
    from ctxlab.model.registry import DEFAULT_MODEL, REGISTRY, packaged_path

    try:
        packaged_path(REGISTRY[DEFAULT_MODEL])
    except CtxlabError as exc:
        pytest.skip(str(exc))
    return DEFAULT_MODEL
