"""Servers for the serving tests: a real `ctxlab serve` process (tests/servers.py: the
session's shared one, or a test's own), or the app in a thread of this process over an
engine a test built."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.cli.conftest import run_in_process
from tests.servers import ROOT, ctxlab_serve, stop, wait_healthy  # noqa: F401 (helpers)


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


@pytest.fixture
def cli(monkeypatch, capsys):
    """`ctxlab ARGS` in this process through the CLI's own entry point: `cli("serve", ...)`."""
    return lambda *args: run_in_process(monkeypatch, capsys, *args)
