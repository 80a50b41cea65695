"""`vllm bench serve`'s definitions on hand-made results, the printed labels, arrivals,
workloads (hash ids -> identical text), and that the load generator never imports torch."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.bench.metrics import (
    RequestResult,
    parse_goodput,
    parse_percentiles,
    peaks,
    quantile_intervals,
    summarize,
)
from ctxlab.bench.report import result_lines
from ctxlab.bench.runner import arrival_times
from ctxlab.bench.words import WORDS
from ctxlab.bench.workloads import random_requests, shared_prefix_requests, trace_requests
from ctxlab.errors import CtxlabError

ROOT = Path(__file__).resolve().parents[2]
REAL_TRACE = ROOT.parent / "shared" / "data" / "traces" / "conversation_trace.jsonl"


def result(i: int, start: float, ttft: float, itl: list[float], out: int, prompt: int = 10):
    return RequestResult(
        index=i,
        prompt_len=prompt,
        success=True,
        start=start,
        ttft=ttft,
        itl=itl,
        latency=ttft + sum(itl),
        output_tokens=out,
        prompt_tokens=prompt,
        cached_tokens=4,
        chunks=len(itl) + 1,
    )


def test_summary_follows_vllm_definitions():
    rs = [
        result(0, 0.0, 0.1, [0.02, 0.04], 3),  # TPOT (0.16 - 0.1) / 2 = 0.03
        result(1, 0.5, 0.3, [0.05], 2),  # TPOT 0.05
        result(2, 1.0, 0.2, [], 1),  # one token: no TPOT, counts 0 for goodput
        RequestResult(index=3, prompt_len=50, error="HTTP 500: no"),
    ]
    m = summarize(rs, duration=2.0, percentiles=[50, 90], goodput={"ttft": 250, "tpot": 40})
    assert (m["completed"], m["failed"]) == (3, 1)
    assert m["total_input_tokens"] == 30 and m["total_output_tokens"] == 6
    assert m["cached_input_tokens"] == 12
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(3.0)
    assert m["total_token_throughput"] == pytest.approx(18.0)
    assert m["mean_ttft_ms"] == pytest.approx(200.0) and m["median_ttft_ms"] == pytest.approx(200)
    assert m["mean_tpot_ms"] == pytest.approx(40.0)  # only requests with > 1 token
    assert m["p90_ttft_ms"] == pytest.approx(280.0)  # linear: 200 + 0.8 * (300 - 200)
    assert m["mean_itl_ms"] == pytest.approx(110 / 3)  # pooled gaps: 20, 40, 50
    assert m["p50_itl_ms"] == pytest.approx(40.0)
    assert m["mean_e2el_ms"] == pytest.approx((160 + 350 + 200) / 3)
    assert m["std_ttft_ms"] == pytest.approx(float(np.std([100, 300, 200])))
    # goodput: #0 (100 ms, 30 ms) and #2 (200 ms, 0) meet both SLOs, #1 misses TTFT
    assert m["request_goodput"] == pytest.approx(1.0)


def test_peaks_count_per_second_buckets():
    rs = [result(0, 0.0, 0.5, [0.2, 0.2, 0.2], 4), result(1, 1.2, 0.1, [0.1], 2)]
    tok, running = peaks(rs)
    # tokens at 0.5, 0.7, 0.9 (second 0), 1.1 and 1.3, 1.4 (second 1) -> 3 in each
    assert tok == 3.0
    assert running == 2.0  # both active during second 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.001, 10.0), min_size=1, max_size=40), st.floats(1, 100))
def test_percentiles_interpolate_linearly(values, p):
    rs = [result(i, 0.0, v, [], 1) for i, v in enumerate(values)]
    m = summarize(rs, 1.0, [p])
    key = f"p{int(p) if int(p) == p else p}_ttft_ms"
    assert m[key] == pytest.approx(float(np.percentile(np.array(values) * 1000, p)), rel=1e-9)


def test_printed_lines_are_vllms():
    m = summarize([result(0, 0.0, 0.1, [0.02], 2)], 1.0, [50, 99.9], {"ttft": 1000})
    lines = result_lines(m, [50, 99.9], ["ttft", "tpot", "itl", "e2el"], 8, 2.0)
    text = "\n".join(lines)
    assert lines[0] == "=" * 12 + " Serving Benchmark Result " + "=" * 12
    for label in (
        "Successful requests:",
        "Maximum request concurrency:",
        "Request rate configured (RPS):",
        "Benchmark duration (s):",
        "Total input tokens:",
        "Total generated tokens:",
        "Request throughput (req/s):",
        "Request goodput (req/s):",
        "Output token throughput (tok/s):",
        "Peak output token throughput (tok/s):",
        "Peak concurrent requests:",
        "Total Token throughput (tok/s):",
        "Mean TTFT (ms):",
        "Median TPOT (ms):",
        "P99.9 ITL (ms):",
        "P50 E2EL (ms):",
    ):
        assert any(ln.startswith(label) and len(ln) >= 41 for ln in lines), label
    assert "-----Time per Output Token (excl. 1st token)------" in text
    assert lines[-1] == "=" * 50


def test_every_median_and_percentile_has_its_n_and_an_interval_where_n_allows_one():
    rs = [result(i, 0.1 * i, 0.1 + 0.01 * (i % 7), [0.02, 0.03 + 0.001 * i], 3) for i in range(30)]
    rs.append(RequestResult(index=30, prompt_len=5, error="HTTP 500: no"))
    m = summarize(rs, 5.0, [90, 99])
    assert m["samples"] == {"ttft": 30, "tpot": 30, "itl": 60, "e2el": 30}
    for name in ("ttft", "tpot", "itl", "e2el"):
        iv = m["intervals"][f"median_{name}_ms"]
        assert iv["n"] == m["samples"][name] and iv["method"].startswith("bootstrap")
        assert iv["low"] <= m[f"median_{name}_ms"] <= iv["high"], name
        # 30 values leave fewer than 5 beyond a P90 or P99 (ITL's 60 gaps: beyond a P99)
        for key in (f"p90_{name}_ms", f"p99_{name}_ms"):
            iv = m["intervals"][key]
            if key == "p90_itl_ms":
                assert iv["method"] == "bootstrap by request" and iv["low"] <= m[key], key
                continue
            assert iv["method"] == "too few" and iv["low"] is None and iv["high"] is None, key
            assert iv["value"] == pytest.approx(m[key], abs=1e-3)
    assert m["intervals"]["median_itl_ms"]["method"] == "bootstrap by request"
    ttft = m["intervals"]["median_ttft_ms"]
    assert ttft["low"] < ttft["high"]  # 7 distinct TTFTs: a real spread, not zero-wide
    lines = result_lines(m, [90, 99], ["ttft", "itl"], None, math.inf)
    assert any(ln.startswith("TTFT samples (n):") and ln.split()[-1] == "30" for ln in lines)
    assert any(ln.startswith("ITL samples (n):") and ln.split()[-1] == "60" for ln in lines)
    assert next(ln for ln in lines if ln.startswith("P99 TTFT 95% CI (ms):")).split()[-1] == "n/a"
    ci = next(ln for ln in lines if ln.startswith("Median TTFT 95% CI (ms):"))
    low, high = (float(x) for x in ci.split(":")[1].split(" - "))
    assert low == pytest.approx(m["intervals"]["median_ttft_ms"]["low"], abs=0.01)
    assert high == pytest.approx(m["intervals"]["median_ttft_ms"]["high"], abs=0.01)


def test_p99_gets_an_interval_from_500_values():
    rng = np.random.default_rng(4)
    xs = list(rng.exponential(10.0, size=600))
    iv = quantile_intervals(xs, [99.0])[0]
    assert iv.method == "bootstrap" and iv.low < iv.value < iv.high
    assert quantile_intervals(xs[:400], [99.0])[0].method == "too few"


def test_itl_intervals_resample_whole_requests():
    """Gaps within a request are correlated (each request has its own pace): resampling
    pooled gaps pretends there are 4000 independent values and gives a far too narrow
    interval; resampling requests gives the width 40 independent paces allow."""
    rng = np.random.default_rng(5)
    paces = rng.uniform(10.0, 100.0, size=40)
    gaps = [float(p + rng.normal(0, 0.1)) for p in paces for _ in range(100)]
    pooled = quantile_intervals(gaps, [50.0])[0]
    by_request = quantile_intervals(gaps, [50.0], groups=[100] * 40)[0]
    assert by_request.method == "bootstrap by request"
    assert by_request.value == pytest.approx(pooled.value)
    assert (by_request.high - by_request.low) > 3 * (pooled.high - pooled.low)
    few = quantile_intervals(gaps[:400], [50.0], groups=[100] * 4)[0]
    assert few.method == "too few"  # 4 requests are too few to resample


def test_quantile_intervals_agree_with_the_stats_module():
    """The numpy bootstrap is ctxlab.stats' method: the same point, and bounds within a
    small fraction of the interval's width (different random draws)."""
    from ctxlab.stats import percentile_interval

    rng = np.random.default_rng(3)
    xs = list(rng.exponential(100.0, size=150))
    for q in (50.0, 90.0):
        fast = quantile_intervals(xs, [q])[0]
        slow = percentile_interval(xs, q)
        width = slow.high - slow.low
        assert fast.value == pytest.approx(slow.value)
        assert abs(fast.low - slow.low) < 0.25 * width and abs(fast.high - slow.high) < 0.25 * width
    assert quantile_intervals([], [50.0])[0].n == 0
    one = quantile_intervals([7.0], [50.0, 99.0])
    assert [(i.low, i.value, i.high) for i in one] == [(7.0, 7.0, 7.0)] * 2


def test_arrivals():
    assert arrival_times(5, math.inf, 1.0, 0) == [0.0] * 5
    a = np.diff(arrival_times(4001, 20.0, 1.0, 0))
    assert a.mean() == pytest.approx(1 / 20, rel=0.05)  # Poisson: mean gap 1/rate
    assert a.std() == pytest.approx(1 / 20, rel=0.08)  # exponential: std = mean
    bursty = np.diff(arrival_times(4001, 20.0, 0.25, 0))
    assert bursty.mean() == pytest.approx(1 / 20, rel=0.1) and bursty.std() > 1.7 / 20
    assert arrival_times(10, 3.0, 1.0, 7) == arrival_times(10, 3.0, 1.0, 7)
    with pytest.raises(CtxlabError, match="request-rate"):
        arrival_times(3, 0.0, 1.0, 0)


def test_workloads_are_seeded_and_shared_prefixes_are_shared():
    a = random_requests(5, 20, 8, 0.5, seed=3)
    assert [r.prompt for r in a] == [r.prompt for r in random_requests(5, 20, 8, 0.5, seed=3)]
    assert all(10 <= r.prompt_len <= 30 and len(r.prompt.split()) == r.prompt_len for r in a)
    assert set(a[0].prompt.split()) <= set(WORDS)
    s = shared_prefix_requests(6, 2, 12, 5, 4, seed=0)
    assert s[0].prompt.split()[:12] == s[2].prompt.split()[:12] != s[1].prompt.split()[:12]
    assert s[0].prompt.split()[12:] != s[2].prompt.split()[12:]


def write_trace(path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    import json

    lines = [
        json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": h})
        for t, n, o, h in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_trace_text_follows_hash_ids(tmp_path):
    path = write_trace(
        tmp_path / "t.jsonl",
        [(0, 10, 3, [1, 2, 3]), (500, 9, 2, [1, 2, 4]), (1500, 4, 2, [7]), (2000, 8, 1, [1, 5])],
    )
    reqs = trace_requests(path, 4, None, 0.5)
    words = [r.prompt.split() for r in reqs]
    assert [len(w) for w in words] == [10, 9, 4, 8]
    assert words[0][:8] == words[1][:8] and words[0][8:] != words[1][8:]  # hashes 1,2 shared
    assert words[3][:4] == words[0][:4] and words[3][4:] != words[0][4:8]
    assert [r.arrival for r in reqs] == [0.0, 0.25, 0.75, 1.0]  # timestamps kept, scaled
    assert [r.output_len for r in reqs] == [3, 2, 2, 1]
    again = trace_requests(path, 4, 2, 1.0)  # the same ids give the same text in every run
    assert [r.prompt for r in again] == [r.prompt for r in reqs[:2]]


@pytest.mark.skipif(not REAL_TRACE.exists(), reason="shared/data traces are absent")
def test_real_mooncake_trace_reuse_becomes_identical_text():
    reqs = trace_requests(REAL_TRACE, 512, 40, 1.0)
    from ctxlab.sim.trace import read_mooncake

    raw = read_mooncake(REAL_TRACE).requests[:40]
    first = [r.hash_ids[0] for r in raw]
    pairs = [(i, j) for i in range(40) for j in range(i) if first[i] == first[j]]
    assert pairs, "the first requests of the trace share prefixes"
    for i, j in pairs[:5]:
        k = 0
        while k < min(len(raw[i].hash_ids), len(raw[j].hash_ids)) and (
            raw[i].hash_ids[k] == raw[j].hash_ids[k]
        ):
            k += 1
        wi, wj = reqs[i].prompt.split(), reqs[j].prompt.split()
        n = min(k * 512, len(wi), len(wj))
        assert wi[:n] == wj[:n]
    assert [len(r.prompt.split()) for r in reqs] == [r.input_len for r in raw]


def test_bad_options_are_one_sentence():
    with pytest.raises(CtxlabError, match="--goodput 'ttfb:3'"):
        parse_goodput(["ttfb:3"])
    with pytest.raises(CtxlabError, match="milliseconds"):
        parse_goodput(["ttft:soon"])
    assert parse_goodput(["ttft:300 tpot:50", "e2el:2000"]) == {
        "ttft": 300.0,
        "tpot": 50.0,
        "e2el": 2000.0,
    }
    with pytest.raises(CtxlabError, match="metric-percentiles"):
        parse_percentiles("50,200")


def test_the_load_generator_never_imports_torch():
    code = (
        "import sys, ctxlab.bench.serve, ctxlab.commands.bench; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
