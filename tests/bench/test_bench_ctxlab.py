"""`ctxlab bench serve` against the real server: a trace's shared hash ids become the server's
prefix-cache hits, exactly, and a multi-turn chat reuses its earlier turns (every chat also
shares the template's system-prompt page)."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from ctxlab.cli import app
from ctxlab.engine import LLM
from tests.bench.test_bench_metrics import write_trace
from tests.serve.conftest import in_process, metric

pytestmark = pytest.mark.model


def bench(url: str, out, *args: str) -> dict:
    res = CliRunner().invoke(
        app,
        ["bench", "serve", "--base-url", url, "--model", "smollm2-135m", "--out", str(out),
         "--json", *args],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return json.loads((out / "result.json").read_text())


def test_trace_reuse_is_the_servers_prefix_hits(loaded, tmp_path):
    # 16 tokens per hash id = one engine page; the block holding a prompt's last token is
    # never taken from the cache, so the hits are the shared full pages before it.
    rows = [
        (0, 40, 3, [11, 12, 13]),
        (100, 40, 3, [11, 12, 14]),  # shares 11, 12: 32 tokens
        (200, 24, 3, [11, 15]),  # shares 11: 16 tokens
        (300, 20, 3, [21, 22]),  # nothing
    ]
    trace = write_trace(tmp_path / "trace.jsonl", rows)
    llm = LLM(loaded, kv_pool_tokens=2048)
    with in_process(llm.engine, model_name="smollm2-135m") as url:
        doc = bench(
            url, tmp_path, "--dataset", "trace", "--trace", str(trace),
            "--trace-hash-block", "16", "--max-concurrency", "1", "--ignore-eos",
        )  # fmt: skip
        text = httpx.get(f"{url}/metrics").text
    assert doc["cached_tokens"] == [0, 32, 16, 0]
    assert doc["input_lens"] == [40, 40, 24, 20]  # one token per word on this model
    assert doc["output_lens"] == [3, 3, 3, 3] and doc["completed"] == 4
    assert metric(text, "ctxlab:prefix_cache_hits_total") == 48
    assert metric(text, "ctxlab:generation_tokens_total") == 12 + 1  # + the probe's token


def test_multi_turn_reuses_earlier_turns(loaded, tmp_path):
    llm = LLM(loaded, kv_pool_tokens=2048)
    with in_process(llm.engine, model_name="smollm2-135m") as url:
        doc = bench(
            url, tmp_path, "--dataset", "multi-turn", "--num-prompts", "2", "--turns", "2",
            "--input-len", "40", "--output-len", "4", "--max-concurrency", "1",
        )  # fmt: skip
    assert doc["completed"] == 4
    cached, lens = doc["cached_tokens"], doc["input_lens"]
    for conv in (0, 2):  # turn 2 finds turn 1's whole prompt (all but its last page) cached
        assert cached[conv + 1] >= (lens[conv] - 1) // 16 * 16 > cached[conv]
