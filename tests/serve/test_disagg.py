"""Prefill and decode in two processes (`ctxlab serve --role prefill|decode`, --disaggregated).

The prefill side is always a real `ctxlab serve --role prefill` process; the decode side is
the app in this process over a `DecodeEngine` (so its pool can be inspected), or a real
`ctxlab serve --role decode` process that the test kills. Faults are injected in the prefill
process with CTXLAB_DISAGG_FAULT (see ctxlab/serve/disagg_prefill.py).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.serve.conftest import ROOT, in_process, stop, wait_healthy

PAGE = 16
POOL = 4096
LONG = " ".join(f"w{i} the cat sat on the mat" for i in range(40))  # ~ 300 tokens


@contextlib.contextmanager
def prefill_process(
    address: str, fault: str = ""
) -> Iterator[tuple[subprocess.Popen, queue.Queue]]:
    """A `ctxlab serve --role prefill` process on `address`; yields it and its stderr lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("CTXLAB_DISAGG_FAULT", None)
    if fault:
        env["CTXLAB_DISAGG_FAULT"] = fault
    main = "from ctxlab.cli import main; main()"
    cmd = [sys.executable, "-c", main, "serve", "--role", "prefill", "--kv-socket", address]
    cmd += ["--threads", "1", "--kv-pool-tokens", str(POOL), "--page-size", str(PAGE)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    lines: queue.Queue[str] = queue.Queue()

    def read_err() -> None:
        for line in proc.stderr or ():
            lines.put(line)

    threading.Thread(target=read_err, daemon=True).start()
    try:
        yield proc, lines
    finally:
        stop(proc)


def wait_ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline() if proc.stdout else ""
    assert line.startswith("ready kv"), line


def decode_engine(loaded, address: str):
    from ctxlab.engine import LLM
    from ctxlab.serve.disagg_channel import Channel, connect
    from ctxlab.serve.disagg_decode import DecodeEngine

    llm = LLM(loaded, kv_pool_tokens=POOL, block_size=PAGE)
    return DecodeEngine(llm.engine, Channel(connect(address)), "smollm2-135m@fp32")


def complete(url: str, prompt: str, max_tokens: int = 8) -> httpx.Response:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=300)


def settle(engine, timeout: float = 30.0) -> None:
    """Wait until the decode engine has nothing in flight (its loop runs in a thread)."""
    end = time.monotonic() + timeout
    while engine.has_unfinished() and time.monotonic() < end:
        time.sleep(0.05)


def colocated_texts(loaded, prompts: list[str], max_tokens: int = 8) -> list[str]:
    """What one colocated server (the same app over a plain engine) answers."""
    from ctxlab.engine import LLM

    llm = LLM(loaded, kv_pool_tokens=POOL, block_size=PAGE)
    with in_process(llm.engine) as url:
        return [complete(url, p, max_tokens).json()["choices"][0]["text"] for p in prompts]


@pytest.fixture(scope="module")
def loaded(serve_model):
    from ctxlab.model import load_model

    return load_model(serve_model)


@pytest.mark.server
def test_tokens_as_colocated_and_a_failed_transfer_fails_its_request_alone(loaded, tmp_path):
    """Request 2's first page is corrupted in flight and the prefill side fails while sending
    request 4: each fails with one sentence; requests 1 and 3 answer what a colocated engine
    answers; both pools are empty afterwards."""
    address = str(tmp_path / "kv.sock")
    with prefill_process(address, "corrupt:2,fail:4") as (proc, _):
        wait_ready(proc)
        engine = decode_engine(loaded, address)
        with in_process(engine) as url:
            first = complete(url, LONG + " one")
            bad = complete(url, LONG + " two")
            third = complete(url, LONG + " three")
            failed = complete(url, LONG + " four")
            settle(engine)
            assert engine.stats().blocks_used == 0
            assert engine.prefill_stats()["blocks_used"] == 0
    assert first.status_code == 200 and third.status_code == 200
    assert bad.status_code == 500
    assert "checksum mismatch" in bad.json()["error"]["message"]
    assert failed.status_code == 500
    assert "prefill process failed: injected fault" in failed.json()["error"]["message"]
    assert engine.num_transfers == 2 and engine.num_failed == 2
    assert engine.bytes_moved > 0
    texts = [r.json()["choices"][0]["text"] for r in (first, third)]
    assert texts == colocated_texts(loaded, [LONG + " one", LONG + " three"])


@pytest.mark.server
def test_prefill_process_dies_mid_transfer(loaded, tmp_path):
    """The prefill process exits after the first page of request 2: that request fails with
    one sentence and its reserved blocks return; a short prompt still runs locally, and a
    long one is refused with the same reason."""
    address = str(tmp_path / "kv.sock")
    with prefill_process(address, "die:2") as (proc, _):
        wait_ready(proc)
        engine = decode_engine(loaded, address)
        with in_process(engine) as url:
            ok = complete(url, LONG)
            dead = complete(url, LONG + " again")
            settle(engine)
            assert engine.stats().blocks_used == 0
            short = complete(url, "Hello")
            later = complete(url, LONG + " later")
            settle(engine)
            assert engine.stats().blocks_used == 0
        assert proc.wait(timeout=30) == 3
    assert ok.status_code == 200
    assert dead.status_code == 500
    assert "prefill process is gone" in dead.json()["error"]["message"]
    assert short.status_code == 200
    assert later.status_code == 500
    assert "prefill process is gone" in later.json()["error"]["message"]


@pytest.mark.server
def test_decode_process_dies_and_the_prefill_pool_empties(serve_model, tmp_path):
    """A real decode process is killed while a long prompt is being prefilled and sent; the
    prefill process drops the request, reports its pool empty, and takes a new decode peer."""
    address = str(tmp_path / "kv.sock")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    main = "from ctxlab.cli import main; main()"
    cmd = [sys.executable, "-c", main, "serve", "--role", "decode", "--kv-socket", address]
    cmd += ["--port", "0", "--threads", "1", "--kv-pool-tokens", str(POOL)]
    cmd += ["--page-size", str(PAGE)]
    with prefill_process(address) as (proc, lines):
        wait_ready(proc)
        dec = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        try:
            url = (dec.stdout.readline() if dec.stdout else "").split()[1]
            wait_healthy(url, dec, 180, "ctxlab serve --role decode")
            long_prompt = " ".join([LONG] * 6)  # ~1.8K tokens: seconds of prefill on one core

            def send() -> None:
                with contextlib.suppress(httpx.HTTPError):
                    complete(url, long_prompt, 4)

            threading.Thread(target=send, daemon=True).start()
            time.sleep(1.0)
            dec.send_signal(signal.SIGKILL)
            dec.wait(timeout=30)
        finally:
            stop(dec)
        report = _line_with(lines, "went away", 120)
        assert "blocks in use 0 of" in report, report
        # the prefill process accepts the next decode peer
        from ctxlab.serve.disagg_channel import Channel, connect

        ch = Channel(connect(address))
        ch.send({"kind": "stats"})
        assert ch.recv()[0]["blocks_used"] == 0
        ch.close()


def test_role_flags_are_checked(cli, monkeypatch):
    """Misuse is one sentence and exit 2, before any model loads (in this process: a model
    load would be a failure, not a server left running)."""
    import ctxlab.engine

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model would load")

    monkeypatch.setattr(ctxlab.engine, "LLM", no_model)
    for args, words in (
        (["--role", "prefill"], "needs --kv-socket"),
        (["--role", "sideways"], "is unknown"),
        (["--disaggregated", "--role", "decode", "--kv-socket", "x"], "not both"),
        (["--disaggregated", "--policy", "h2o", "--budget", "64"], "no --policy"),
    ):
        r = cli("serve", *args)
        assert r.code == 2, (args, r.err)
        assert words in r.err and "Traceback" not in r.err, r.err


def _line_with(lines: queue.Queue, needle: str, timeout: float) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if needle in line:
            return line
    raise AssertionError(f"no line with {needle!r} within {timeout} s")
