"""The load generator against a scripted server whose delays and usage are known: what it
sends, what it measures, failures, the concurrency cap, multi-turn history, trace arrivals,
and Ctrl-C printing what finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxlab.bench.serve import BenchConfig, run_bench
from ctxlab.cli import app
from tests.bench.test_bench_metrics import write_trace

ROOT = Path(__file__).resolve().parents[2]


def test_measures_what_the_server_did(fake_server):
    url, script = fake_server
    cfg = BenchConfig(base_url=url, model="fake", num_prompts=4, input_len=12, output_len=8)
    out = run_bench(cfg, show_progress=False)
    body = script.seen[1]
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.0 and body["max_tokens"] == 8 and "ignore_eos" not in body
    assert len(body["prompt"].split()) == 12
    rs = out.results
    assert [r.success for r in rs] == [True] * 4
    for r in rs:
        assert r.ttft >= script.first_delay
        assert len(r.itl) == script.chunks - 1 and min(r.itl) >= script.gap * 0.9
        assert r.latency == pytest.approx(r.ttft + sum(r.itl))
        assert r.output_len == 5 and r.tpot == pytest.approx((r.latency - r.ttft) / 4)
    m = out.summary
    assert (m["completed"], m["total_output_tokens"], m["cached_input_tokens"]) == (4, 20, 28)
    assert m["total_input_tokens"] == 48
    assert any(ln.startswith("Cached input tokens (server):     ") for ln in out.lines)
    assert out.document["generated_texts"][0] == " t0 t1 t2 t3 t4"


def test_failures_are_counted_not_fatal(fake_server):
    url, script = fake_server
    script.fail_on = {2, 4}
    out = run_bench(
        BenchConfig(base_url=url, model="fake", num_prompts=5, input_len=4, output_len=3),
        show_progress=False,
    )
    assert (out.summary["completed"], out.summary["failed"]) == (3, 2)
    errors = [e for e in out.document["errors"] if e]
    assert errors == ["HTTP 500: scripted failure"] * 2


def test_max_concurrency_and_ignore_eos(fake_server):
    url, script = fake_server
    cfg = BenchConfig(
        base_url=url, model="fake", num_prompts=6, input_len=4, output_len=3,
        max_concurrency=2, ignore_eos=True,
    )  # fmt: skip
    out = run_bench(cfg, show_progress=False)
    assert out.summary["completed"] == 6 and script.peak_active == 2
    assert all(b.get("ignore_eos") for b in script.seen[1:])
    assert "Maximum request concurrency:             2" in "\n".join(out.lines)


def test_multi_turn_sends_the_history(fake_server):
    url, script = fake_server
    cfg = BenchConfig(
        base_url=url, model="fake", dataset="multi-turn", num_prompts=2, turns=3,
        input_len=5, output_len=4,
    )  # fmt: skip
    out = run_bench(cfg, show_progress=False)
    assert out.summary["completed"] == 6
    convs: dict[str, list[list[dict]]] = {}
    for body in script.seen[1:]:
        convs.setdefault(body["messages"][0]["content"], []).append(body["messages"])
    assert len(convs) == 2
    for turns in convs.values():
        assert [len(m) for m in turns] == [1, 3, 5]
        assert turns[2][:3] == turns[1] and turns[1][1] == {
            "role": "assistant",
            "content": " t0 t1 t2 t3",
        }


def test_a_trace_is_replayed_at_its_timestamps(fake_server, tmp_path):
    url, script = fake_server
    trace = write_trace(
        tmp_path / "t.jsonl", [(0, 6, 2, [1, 2]), (400, 6, 2, [1, 3]), (900, 3, 2, [9])]
    )
    cfg = BenchConfig(base_url=url, model="fake", dataset="trace", trace=trace, trace_hash_block=4)
    out = run_bench(cfg, show_progress=False)
    assert out.summary["completed"] == 3
    t = script.arrivals[1:]
    assert t[1] - t[0] >= 0.39 and t[2] - t[0] >= 0.89  # not earlier than the trace says
    assert t[2] - t[0] < 0.9 + 1.0
    prompts = [b["prompt"].split() for b in script.seen[1:]]
    assert prompts[0][:4] == prompts[1][:4] and prompts[0][4:] != prompts[1][4:]


def test_cli_json_and_one_sentence_errors(fake_server, tmp_path):
    url, _ = fake_server
    args = ["bench", "serve", "--base-url", url, "--model", "fake", "--num-prompts", "2",
            "--input-len", "4", "--output-len", "2", "--out", str(tmp_path), "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["completed"] == 2 and Path(doc["result_file"]).exists()
    saved = json.loads(Path(doc["result_file"]).read_text())
    assert saved["model_id"] == "fake" and len(saved["ttfts"]) == 2
    bad = CliRunner().invoke(app, [*args[:3], "http://127.0.0.1:9", *args[4:]])
    assert bad.exit_code != 0 and "did not answer a test request" in str(bad.exception)
    wrong = CliRunner().invoke(app, [*args, "--goodput", "speed:3"])
    assert "--goodput 'speed:3'" in str(wrong.exception)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child is POSIX")
def test_ctrl_c_prints_what_finished(fake_server, tmp_path):
    url, script = fake_server
    script.first_delay, script.gap = 0.1, 0.05
    cmd = [sys.executable, "-c", "from ctxlab.cli import main; main()", "bench", "serve",
           "--base-url", url, "--model", "fake", "--num-prompts", "60", "--request-rate", "6",
           "--input-len", "4", "--output-len", "4", "--out", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    end = time.monotonic() + 60
    while len(script.seen) < 8 and time.monotonic() < end:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted:" in out and "of 60 requests finished" in out
    assert "Successful requests:" in out and "Mean TTFT (ms):" in out
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["interrupted"] is True and 0 < saved["completed"] < 60
