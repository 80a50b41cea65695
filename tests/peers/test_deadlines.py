"""Limits that limit: a server that accepts and never answers, sends headers and then
nothing, trickles one byte at a time or streams keep-alives forever holds no command longer
than its total deadline (`--max-seconds`, `--timeout`), and the deadline is named."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from ctxlab.peer.deadline import Deadline, DeadlinePassed, lines, request, stream
from tests.peers.commands import argv
from tests.peers.hostile import Script, hostile

HANGS = ("silent", "silent-body", "trickle", "keepalive")
# seconds: a 1-2 s deadline plus start-up (the first eval loads its tokenizer, ~20 s on a
# busy 2-core machine), far below the 300-600 s the per-phase timeouts waited
BOUND = 60.0


@pytest.mark.parametrize("hang", HANGS)
@pytest.mark.parametrize("name", ["bench", "eval", "rag"])
def test_a_hanging_server_is_one_sentence_within_the_timeout(cli, tmp_path, rag_db, name, hang):
    with hostile(Script(hang=hang)) as (url, _):
        start = time.monotonic()
        result = cli(*argv(name, url, tmp_path, rag_db, seconds="1"))
        took = time.monotonic() - start
    assert took < BOUND, took
    assert result.code == 2 and "Traceback" not in result.err, result.err
    last = result.err_lines[-1]
    assert last.startswith("error: ") and "127.0.0.1" in last
    assert "1 s" in last  # names the deadline it gave up at


@pytest.mark.parametrize("hang", ["trickle", "keepalive"])
def test_bench_timeout_is_total_for_timed_requests_too(cli, tmp_path, rag_db, hang):
    """The test request is answered; every timed request then trickles or sends
    keep-alives: each ends at --timeout, and a run with nothing measured fails."""
    with hostile(Script(hang=hang, hang_after=1)) as (url, _):
        start = time.monotonic()
        result = cli(*argv("bench", url, tmp_path, rag_db, seconds="1"))
        took = time.monotonic() - start
    assert took < BOUND, took
    assert result.code == 1, result.err
    assert "every timed request failed (2 of 2)" in result.err
    assert "no answer within the timeout of 1 s" in result.err


@pytest.mark.parametrize("hang", HANGS)
def test_probe_max_seconds_bounds_a_stuck_request(cli, tmp_path, hang):
    """--max-seconds is the probe's total: a request still waiting when it runs out ends
    the run with what it measured (the calibration is listed as not run)."""
    out = tmp_path / "p.json"
    with hostile(Script(hang=hang)) as (url, _):
        start = time.monotonic()
        result = cli("probe", "--server", url, "--out", str(out), "--yes", "--max-seconds", "2")
        took = time.monotonic() - start
    assert took < BOUND, took
    assert result.code == 0 and "Traceback" not in result.err, result.err
    assert "calibration" in json.loads(out.read_text())["not_run"]


@pytest.mark.parametrize("hang", HANGS)
def test_a_request_is_bounded_in_total(hang):
    """The layer itself: per-phase timeouts of 60 s, a total of 0.8 s."""
    with hostile(Script(hang=hang)) as (url, _), httpx.Client(timeout=60.0) as client:
        deadline = Deadline(0.8)
        start = time.monotonic()
        with (
            pytest.raises(DeadlinePassed, match=r"0\.8 s"),
            stream(client, "POST", url + "/v1/completions", deadline, json={}) as r,
        ):
            for _ in lines(r, deadline):
                pass
        assert time.monotonic() - start < 5.0
        with pytest.raises(DeadlinePassed):
            request(client, "POST", url + "/v1/chat/completions", Deadline(0.5), json={})


def test_a_prompt_answer_is_not_cut():
    with hostile() as (url, script), httpx.Client() as client:
        body = {"messages": [{"role": "user", "content": "a b c"}]}
        reply = request(client, "POST", url + "/v1/chat/completions", Deadline(5.0), json=body)
        assert reply.status_code == 200 and json.loads(reply.body)["usage"]["prompt_tokens"] == 3
        # the connection went back to the pool whole: a second request on it works
        again = request(client, "POST", url + "/v1/chat/completions", Deadline(5.0), json=body)
        assert again.status_code == 200
    assert script.posts == ["/v1/chat/completions"] * 2
