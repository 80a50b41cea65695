"""What a production client sends that the server must survive: a ratio budget over a short
chat, a denormal temperature, a client that closes mid-body. Each is served as meant or
refused with a 400 naming the field, never a 500. Over real HTTP to the app in a thread of
this process (`in_process`). (vLLM's `continuous_usage_stats`, once refused here, is served:
tests/serve/test_serve_openai.py.)"""

from __future__ import annotations

import httpx
import pytest

from ctxlab.engine import LLM, SamplingParams
from tests.serve.conftest import in_process

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]

CHAT = [{"role": "user", "content": "Hi! What is the capital of France?"}]


def _post(url: str, body: dict, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(url + path, json={"model": "m", **body}, timeout=120)


def test_a_ratio_budget_serves_a_short_chat_untouched(loaded):
    """`ctxlab serve --policy snapkv --budget 0.5` (the README's example): half of a short
    chat is under SnapKV's window, so the chat passes untouched (the full cache's text)."""
    ids = loaded.tokenizer.encode(" ".join(["word"] * 60))[:45]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    full = LLM(loaded, kv_pool_tokens=1024).generate(ids, params)[0].token_ids
    llm = LLM(loaded, policy="snapkv", budget=0.5, kv_pool_tokens=1024)
    assert llm.generate(ids, params)[0].token_ids == full
    with in_process(llm.engine) as url:
        r = _post(url, {"messages": CHAT, "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        r = _post(url, {"prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True},
                  "/v1/completions")  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 1e-8])
def test_a_denormal_temperature_samples_greedily(loaded, temperature):
    llm = LLM(loaded, kv_pool_tokens=1024)
    with in_process(llm.engine) as url:
        greedy = _post(url, {"messages": CHAT, "max_tokens": 6, "temperature": 0})
        tiny = _post(url, {"messages": CHAT, "max_tokens": 6, "temperature": temperature})
        assert tiny.status_code == 200, tiny.text
        assert tiny.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]


def test_a_client_that_closes_mid_body_leaves_no_traceback(loaded, caplog, capfd):
    import logging
    import socket
    import time
    from urllib.parse import urlsplit

    llm = LLM(loaded, kv_pool_tokens=1024)
    uvicorn_log = logging.getLogger("uvicorn.error")  # it does not propagate to the root
    uvicorn_log.addHandler(caplog.handler)
    try:
        with in_process(llm.engine) as url:
            where = urlsplit(url)
            for _ in range(3):
                s = socket.create_connection((where.hostname, where.port), timeout=10)
                s.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                    b'{"model": "m", "prompt": "hel'
                )
                s.close()  # mid-body
            time.sleep(1.0)  # the server has seen the disconnects (not a timing assertion)
            ok = _post(url, {"prompt": "Hello", "max_tokens": 2}, "/v1/completions")
            assert ok.status_code == 200  # still serving
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert "Traceback" not in capfd.readouterr().err


def test_sigterm_ends_an_open_stream_with_an_error_event_and_done(serve_model):
    """A real process (a real signal): the stream gets an error event and [DONE] from the
    graceful shutdown instead of a cut, and the server exits."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from tests.servers import ROOT, stop, wait_healthy

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", "from ctxlab.cli import main; main()", "serve", "--port", "0",
           "--threads", "1", "--kv-pool-tokens", "8192"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)  # fmt: skip
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("ready "), line
        url = line.split()[1]
        wait_healthy(url, proc, 180, "ctxlab serve")
        served = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        body = {"model": served, "prompt": "Once upon a time", "max_tokens": 3000,
                "ignore_eos": True, "stream": True, "temperature": 0}  # fmt: skip
        lines: list[str] = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            model = r.status_code
            for text in r.iter_lines():
                if not text.startswith("data: "):
                    continue
                lines.append(text[6:])
                if len(lines) == 3:
                    proc.send_signal(signal.SIGTERM)
        assert model == 200
        assert lines[-1] == "[DONE]"
        last = json.loads(lines[-2])
        assert "shutting down" in last["error"]["message"]
        assert 3 <= len(lines) < 3000  # it ended early, as an ended stream
        assert proc.wait(timeout=30) is not None
    finally:
        stop(proc)
