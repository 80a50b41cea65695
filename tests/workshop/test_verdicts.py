"""Predictions against observations: held, failed, not measurable (no model needed)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxlab.workshop.config import Prediction
from ctxlab.workshop.result import Observation
from ctxlab.workshop.verdicts import describe, judge


def verdict(direction: str, base, seen, tolerance: float = 0.0, rng=None) -> str:
    p = Prediction(direction=direction, tolerance=tolerance, range=rng)
    return judge(1, "prefix_miss", "m", p, Observation("m", base, seen)).verdict


@pytest.mark.parametrize(
    ("direction", "base", "seen", "tolerance", "rng", "expected"),
    [
        ("down", 100, 40, 0.0, None, "held"),
        ("down", 100, 140, 0.0, None, "failed"),  # a wrong prediction is reported failed
        ("down", 100, 100, 0.0, None, "failed"),
        ("down", 100, 95, 0.1, None, "failed"),  # fell, but not by more than the tolerance
        ("up", 16, 256, 0.0, None, "held"),
        ("up", 16, 8, 0.0, None, "failed"),
        ("unchanged", 50.0, 55.0, 0.25, None, "held"),
        ("unchanged", 50.0, 70.0, 0.25, None, "failed"),
        ("unchanged", 0, 0, 0.0, None, "held"),
        ("unchanged", 0, 1, 0.5, None, "failed"),  # a zero baseline leaves no relative room
        ("down", 240, 0, 0.0, [0, 0], "held"),
        ("down", 240, 16, 0.0, [0, 0], "failed"),  # right direction, outside the range
        ("up", 0, 256, 0.0, [1, 300], "held"),
    ],
)
def test_verdicts(direction, base, seen, tolerance, rng, expected) -> None:
    assert verdict(direction, base, seen, tolerance, rng) == expected


def test_not_measurable_says_why() -> None:
    p = Prediction(direction="down")
    v = judge(5, "compaction", "facts_lost", p, None, "demonstration 5 was not selected")
    assert v.verdict == "not measurable" and "not selected" in v.reason
    nan = judge(2, "warm_prefix", "tpot_ms", p, Observation("tpot_ms", 3.0, math.nan))
    assert nan.verdict == "not measurable"


def test_a_change_smaller_than_the_noise_is_within_noise_and_keeps_its_numbers() -> None:
    p = Prediction(direction="unchanged", tolerance=0.25)
    seen = Observation("tpot_ms", 93.27, 157.83, digits=2, noise=0.812)
    v = judge(2, "warm_prefix", "tpot_ms", p, seen)
    # +69 % against repeats that scatter by 81 %: neither held nor failed
    assert v.verdict == "within noise"
    assert "93.27 -> 157.83" in v.reason and round(v.change_pct, 1) == 69.2
    assert v.noise_pct == 81.2 and "scatter by 81.2%" in v.reason
    assert describe(p) == "unchanged within 25.0%"
    quiet = judge(2, "warm_prefix", "tpot_ms", p, Observation("tpot_ms", 93.27, 157.83, 2, 0.1))
    assert quiet.verdict == "failed"  # the same change against 10 % noise is a clear failure


@pytest.mark.parametrize(
    ("direction", "low", "high", "expected"),
    [
        ("down", -60.0, -20.0, "held"),
        ("down", -60.0, 5.0, "within noise"),  # the interval of the change includes zero
        ("down", 10.0, 30.0, "failed"),
        ("up", 0.02, 0.30, "held"),
        ("up", -0.05, 0.30, "within noise"),
    ],
)
def test_a_sampled_change_is_read_against_its_interval(direction, low, high, expected) -> None:
    obs = Observation("m", 100.0, 100.0 + (low + high) / 2, 1, None, None, low, high, 16, "test")
    v = judge(6, "retrieval_depth", "m", Prediction(direction=direction), obs)
    assert v.verdict == expected
    assert v.change_low == low and v.change_high == high and v.samples == 16
    assert v.to_json()["change_interval"] == [low, high]


@given(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(-1e6, 1e6, allow_nan=False),
)
def test_with_no_tolerance_exactly_one_direction_holds(base: float, seen: float) -> None:
    held = [verdict(d, base, seen) == "held" for d in ("down", "up", "unchanged")]
    assert sum(held) == 1


def test_a_timing_without_repeats_is_read_against_the_runs_largest_scatter() -> None:
    from ctxlab.workshop.config_file import load_config
    from ctxlab.workshop.registry import BY_KEY
    from ctxlab.workshop.result import DemoResult
    from ctxlab.workshop.runner import _verdicts

    cfg = load_config()
    demos = {
        key: DemoResult(BY_KEY[key].number, key, "t", "not selected") for key in cfg.predictions
    }
    demos["warm_prefix"].status = "run"
    demos["warm_prefix"].observe("tpot_ms", 80.0, 81.0, 2, noise=0.3)  # repeats: 30 % scatter
    demos["page_size"].status = "run"
    demos["page_size"].observe("ttft_ms_after_divergence", 1494.1, 1547.6, 1)  # +3.6 %, once
    got = {(v.key, v.metric): v for v in _verdicts(cfg, demos)}
    once = got["page_size", "ttft_ms_after_divergence"]
    assert once.verdict == "within noise"  # +3.6 % against 30 % scatter is never "held"
    assert "timed without repeats" in once.reason and "30.0%" in once.reason
    assert got["page_size", "waste_tokens"].verdict == "not measurable"  # not observed
    assert {key for key, _ in got} == {"warm_prefix", "page_size"}  # the unselected: unjudged


def test_a_demonstration_not_measurable_on_the_local_engine_leaves_its_required_metrics_missing():
    """Through a server, a demonstration the server cannot run is not required of that run;
    on the local engine "not measurable" is a config the model cannot run, so its required
    metrics stay required and missing (the run is incomplete, exit 1), never exit 0."""
    from ctxlab.workshop.config_file import load_config
    from ctxlab.workshop.registry import BY_KEY, metric_ref
    from ctxlab.workshop.result import DemoResult
    from ctxlab.workshop.runner import _required

    cfg = load_config()
    ref = cfg.required_metrics[0]
    found = metric_ref(ref)
    assert not isinstance(found, str)
    key = found[0].key
    demos = {k: DemoResult(d.number, k, "t", "run") for k, d in BY_KEY.items()}
    demos[key] = DemoResult(found[0].number, key, "t", "not measurable", summary="the model cannot")
    local = {r["metric"]: r for r in _required(cfg, demos, None, served=False)}[ref]
    assert local["required"] and not local["measured"] and local["why"] == "the model cannot"
    served = {r["metric"]: r for r in _required(cfg, demos, None, served=True)}[ref]
    assert not served["required"] and served["why"] == "the model cannot"
