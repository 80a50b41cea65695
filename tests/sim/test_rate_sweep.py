"""The offered rate as a sweep: `--trace-time-scale`, `--sweep trace-time-scale=...` and the
highest swept rate that meets an SLO (`ctxlab.sim.slo`), with its cliff."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxlab.sim.config import SimConfig
from ctxlab.sim.requests import Request, Trace
from ctxlab.sim.run import simulate
from ctxlab.sim.slo import SweptRate, highest_rate
from ctxlab.sim.synthetic import generate_from_spec
from tests.cli.conftest import run_in_process


def swept(*pairs: tuple[float, float]) -> list[SweptRate]:
    return [SweptRate(f"x{rate}", rate, share) for rate, share in pairs]


def test_the_answer_is_the_fastest_rate_before_the_first_miss():
    runs = swept((4.0, 0.5), (1.0, 0.95), (2.0, 0.91), (8.0, 0.97))  # 8 meets again: noise
    answer = highest_rate(runs, 0.9)
    assert answer.best is not None and answer.best.rate_per_s == 2.0
    assert answer.cliff is not None and answer.cliff.rate_per_s == 4.0
    text = answer.sentence("TTFT 1 s")
    assert "2 requests/s" in text and "4 requests/s" in text and "between the two" in text


def test_none_meets_and_all_meet_say_which_way_to_sweep():
    low = highest_rate(swept((1.0, 0.2), (2.0, 0.1)), 0.9)
    assert low.best is None and low.cliff is not None and low.cliff.rate_per_s == 1.0
    assert "sweep slower" in low.sentence("TTFT 1 s")
    high = highest_rate(swept((1.0, 1.0), (2.0, 0.95)), 0.9)
    assert high.best is not None and high.best.rate_per_s == 2.0 and high.cliff is None
    assert "sweep faster" in high.sentence("TTFT 1 s")
    nan = highest_rate(swept((1.0, 0.95), (2.0, math.nan)), 0.9)  # no requests: not met
    assert nan.cliff is not None and nan.cliff.rate_per_s == 2.0
    with pytest.raises(ValueError):
        highest_rate(swept((1.0, 1.0)), 1.5)


@given(st.lists(st.tuples(st.floats(0.01, 100), st.floats(0, 1)), min_size=1, max_size=8))
def test_every_rate_up_to_the_answer_meets_and_the_cliff_misses(pairs):
    runs = swept(*pairs)
    answer = highest_rate(runs, 0.9)
    below = [r for r in runs if answer.best is not None and r.rate_per_s <= answer.best.rate_per_s]
    assert all(r.attainment >= 0.9 for r in below)
    if answer.cliff is not None:
        assert answer.cliff.attainment < 0.9
        assert answer.best is None or answer.cliff.rate_per_s >= answer.best.rate_per_s


def test_a_time_scale_moves_arrivals_and_nothing_else():
    trace = generate_from_spec("n=20,rate=4,seed=3")
    half = trace.time_scaled(0.5)
    assert [r.arrival for r in half.requests] == [r.arrival * 0.5 for r in trace.requests]
    assert [r.input_len for r in half.requests] == [r.input_len for r in trace.requests]
    assert half.offered_rate == pytest.approx(2 * trace.offered_rate)
    assert trace.time_scaled(1) is trace
    together = Trace("t", [Request(i, 0.0, 16, 4, (i,)) for i in range(3)], 16)
    assert together.offered_rate is None


def test_a_faster_trace_queues_more_in_the_simulator(llama8b, h100):
    # the same requests offered 8 times faster on a small pool wait longer for their first token
    trace = generate_from_spec("n=40,rate=2,input=uniform:4096:8192,output=uniform:64:128,seed=2")
    cfg = SimConfig(pool_bytes=8 * 2**30, gpus=1)
    slow = simulate(trace, llama8b, h100, cfg)
    fast = simulate(trace, llama8b, h100, cfg.with_(time_scale=0.125))
    assert fast.metrics["ttft_p99"] > slow.metrics["ttft_p99"]
    assert fast.metrics["makespan_s"] < slow.metrics["makespan_s"]


def test_the_sweep_names_the_highest_rate_meeting_the_slo(monkeypatch, capsys, tmp_path):
    spec = "synthetic:n=60,rate=1,input=uniform:2048:8192,output=uniform:32:64,seed=4"
    res = run_in_process(
        monkeypatch, capsys, "simulate", spec, "llama-3.1-8b", "--device", "h100",
        "--pool-bytes", "4GiB", "--sweep", "trace-time-scale=4,1,0.25,0.0625",
        "--slo-ttft", "1", "--slo-tpot", "0.05", "--json", "--out", str(tmp_path),
    )  # fmt: skip
    assert res.code == 0, res.err
    sweep = json.loads(res.out)["sweep"]
    offered = sweep["offered_rate_per_s"]
    runs = {r["value"]: r for r in sweep["runs"]}
    answer = sweep["rate_answer"]
    assert answer["target_attainment"] == 0.9
    for side in ("highest_meeting", "cliff"):
        run = answer[side]
        if run is not None:
            assert run["rate_per_s"] == pytest.approx(offered / float(run["time_scale"]))
            assert run["slo_attainment"] == runs[run["time_scale"]]["slo_attainment"]
    assert answer["highest_meeting"] is not None and answer["cliff"] is not None, answer
    assert answer["highest_meeting"]["slo_attainment"] >= 0.9 > answer["cliff"]["slo_attainment"]
    assert (tmp_path / "rate.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--trace-time-scale", "0"), "trace time scale must be a positive number"),
        (("--slo-attainment", "1.5"), "--slo-attainment is a share of requests in (0, 1]"),
        (("--sweep", "trace-time-scale=1,-2"), "trace time scale must be a positive number"),
    ],
)
def test_bad_rates_are_one_sentence(monkeypatch, capsys, tmp_path, args, said):
    res = run_in_process(
        monkeypatch, capsys, "simulate", "synthetic:n=4,rate=1,seed=1", "llama-3.1-8b",
        *args, "--out", str(tmp_path),
    )  # fmt: skip
    assert res.code == 2 and said in res.err and "Traceback" not in res.err, res.err


def test_a_trace_that_arrives_at_once_offers_no_rate_to_sweep(monkeypatch, capsys, tmp_path):
    trace = tmp_path / "once.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 1024, "output_length": 8, "hash_ids": [i, 100 + i]}
        for i in range(4)
    ]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = run_in_process(
        monkeypatch, capsys, "simulate", str(trace), "llama-3.1-8b",
        "--sweep", "trace-time-scale=1,0.5", "--out", str(tmp_path),
    )  # fmt: skip
    assert res.code == 2 and "arrives at once" in res.err, res.err
