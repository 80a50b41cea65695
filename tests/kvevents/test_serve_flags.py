"""`ctxlab serve`'s KV-event flags: a mistake is one sentence before the model loads."""

from __future__ import annotations

import pytest

from tests.cli.conftest import run_in_process


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--kv-events-endpoint", "tcp://0.0.0.0:5557"], "loopback"),
        (["--kv-events-endpoint", "tcp://*:5557"], "loopback"),
        (["--kv-events-replay-endpoint", "tcp://127.0.0.1:5558"], "needs --kv-events-endpoint"),
        (
            ["--kv-events-endpoint", "tcp://127.0.0.1:5557", "--kv-events-replay-endpoint", "x"],
            "--kv-events-replay-endpoint",
        ),
        (["--kv-events-endpoint", "tcp://127.0.0.1:5557", "--disaggregated"], "colocated"),
    ],
)
def test_serve_kv_event_mistakes(monkeypatch, capsys, args, says):
    res = run_in_process(monkeypatch, capsys, "serve", "--port", "0", *args)
    assert res.code == 2 and says in res.err, res.err
    assert "Traceback" not in res.err and "loading" not in res.err
