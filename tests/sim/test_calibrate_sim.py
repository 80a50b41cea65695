"""The simulator half of calibration: trace, prompt tokens, mirrored config, verdict (no torch)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from ctxlab.arch import get_preset
from ctxlab.errors import CtxlabError
from ctxlab.sim import calibrate as cal
from ctxlab.sim.steptime import ProfileStepTime
from ctxlab.sim.synthetic import SyntheticSpec, generate

ENGINE = cal.EngineSettings(
    pool_tokens=4096, block_size=16, max_num_batched_tokens=512, max_num_seqs=8
)


def _profile(tmp_path, c0=0.05, c_pre=0.002, c_dec=0.01):
    """A synthetic profile whose steps follow an exact linear law (so the fit recovers it)."""
    steps = []
    for pt, dt, ctx in [
        (0, 1, 100),
        (0, 4, 300),
        (64, 0, 0),
        (256, 0, 0),
        (128, 2, 50),
        (0, 8, 700),
        (512, 3, 200),
        (32, 5, 900),
    ]:
        pk = pt * (pt + 1) // 2
        dk = dt * ctx
        steps.append(
            {
                "prefill_tokens": pt,
                "prefill_keys": pk,
                "decode_tokens": dt,
                "decode_keys": dk,
                "seconds": c0 + c_pre * pt + c_dec * dt,
            }
        )
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "ctxlab-step-profile/1", "steps": steps}))
    return str(path)


def test_sim_side_never_imports_torch():
    import subprocess

    code = "import ctxlab.sim.calibrate, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_trace_rate_scales_gaps_and_keeps_lengths():
    a = cal.calibration_trace(20, seed=3, block_size=16, rate=1.0)
    b = cal.calibration_trace(20, seed=3, block_size=16, rate=4.0)
    assert [r.input_len for r in a.requests] == [r.input_len for r in b.requests]
    assert [r.output_len for r in a.requests] == [r.output_len for r in b.requests]
    ta = np.array([r.arrival for r in a.requests])
    tb = np.array([r.arrival for r in b.requests])
    assert np.allclose(ta, 4 * tb)
    assert a.block_tokens == 16
    with pytest.raises(CtxlabError):
        cal.calibration_trace(0, seed=0, block_size=16, rate=1.0)


def test_token_ids_follow_hash_ids():
    spec = SyntheticSpec(
        n=12, rate=1.0, input="uniform:40:90", output="4", groups=2, prefix=48, seed=1
    )
    trace = generate(spec, block_tokens=16)
    ids = cal.token_ids(trace, vocab_size=5000, seed=7)
    for r, toks in zip(trace.requests, ids, strict=True):
        assert len(toks) == r.input_len
        assert all(1000 <= t < 5000 for t in toks)
    # equal hash-id prefixes <-> equal token prefixes, block by block
    for i, ri in enumerate(trace.requests):
        for j, rj in enumerate(trace.requests[:i]):
            for k in range(min(len(ri.hash_ids), len(rj.hash_ids))):
                same_ids = ri.hash_ids[: k + 1] == rj.hash_ids[: k + 1]
                end = min((k + 1) * 16, ri.input_len, rj.input_len)
                same_tokens = ids[i][:end] == ids[j][:end]
                if same_ids:
                    assert same_tokens
                elif end == (k + 1) * 16:
                    assert not same_tokens
    assert ids == cal.token_ids(trace, vocab_size=5000, seed=7)


def test_sim_config_mirrors_the_engine():
    arch = get_preset("smollm2-135m")
    cfg, pool_bytes = cal.sim_config(arch, ENGINE, "p.json")
    assert cfg.page_size == ENGINE.block_size
    assert cfg.chunk_tokens == ENGINE.max_num_batched_tokens
    assert cfg.max_running == ENGINE.max_num_seqs
    assert cfg.profile == "p.json"
    page_bytes = cfg.page_size * (pool_bytes // ENGINE.pool_tokens)
    assert pool_bytes // page_bytes == ENGINE.pool_tokens // ENGINE.block_size


def test_simulated_trace_completes_and_follows_the_profile(tmp_path):
    prof = _profile(tmp_path)
    trace = cal.calibration_trace(16, seed=2, block_size=16, rate=0.5)
    times, metrics = cal.simulate_trace(trace, get_preset("smollm2-135m"), ENGINE, prof)
    assert metrics["requests_completed"] == 16
    assert len(times.ttft) == 16 and np.all(times.ttft > 0)
    multi = times.output_tokens > 1
    assert np.all(times.tpot[multi] > 0) and np.all(np.isnan(times.tpot[~multi]))
    # a lone request's TTFT is at least its own prefill step under the profile's law
    first = trace.requests[0]
    assert times.ttft[0] >= 0.05 + 0.002 * first.input_len - 1e-9


def test_solo_seconds_and_auto_rate(tmp_path):
    prof = _profile(tmp_path)
    model = ProfileStepTime(prof)
    assert np.allclose(model.coef, [0.05, 0.002, 0, 0.01, 0], atol=1e-9)
    assert cal.solo_seconds(prof, 100, 5) == pytest.approx((0.05 + 0.2) + 4 * (0.05 + 0.01))
    rate = cal.auto_rate(prof, 10, seed=0, block_size=16, load=0.5)
    shape = cal.calibration_trace(10, seed=0, block_size=16, rate=1.0)
    mean = np.mean([cal.solo_seconds(prof, r.input_len, r.output_len) for r in shape.requests])
    assert rate == pytest.approx(0.5 / mean)


def test_compare_relative_errors_and_goal():
    real = cal.engine_times(
        np.zeros(4), np.array([1.0, 2, 3, 4]), np.array([2.0, 4, 6, 8]), np.array([11, 11, 11, 11])
    )
    sim = cal.RequestTimes(real.ttft * 1.1, real.tpot * 0.7, real.output_tokens)
    out = cal.compare(real, sim)
    assert out["engine_ttft_p50"] == pytest.approx(2.5)
    assert out["engine_tpot_p50"] == pytest.approx(0.25)
    assert out["ttft_p50_rel_error"] == pytest.approx(0.1)
    assert out["tpot_p50_rel_error"] == pytest.approx(-0.3)
    assert out["goal_met"] is False
    ok = cal.compare(real, cal.RequestTimes(real.ttft * 0.9, real.tpot * 1.15, real.output_tokens))
    assert ok["goal_met"] is True


def test_step_prediction_on_exact_steps(tmp_path):
    prof = _profile(tmp_path)
    steps = json.loads(Path(prof).read_text())["steps"]
    pred = cal.step_prediction(prof, steps)
    assert pred["steps"] == len(steps)
    assert pred["median_abs_rel_error"] < 1e-9
    assert pred["total_ratio"] == pytest.approx(1.0)
    slow = [{**s, "seconds": 2 * s["seconds"]} for s in steps]
    assert cal.step_prediction(prof, slow)["total_ratio"] == pytest.approx(0.5)


def _payload(goal_met, thirds, drift=None, med=0.1):
    ratio = sum(thirds) / 3
    pred = {
        "steps": 90,
        "total_ratio": ratio,
        "median_abs_rel_error": med,
        "total_ratio_by_third": thirds,
    }
    return {
        "goal_met": goal_met,
        "replay_step_prediction": pred,
        "profile_after_over_before": drift,
    }


def test_explain_names_the_cause_it_sees():
    from ctxlab.sim.calibrate import explain, thirds

    assert explain(_payload(True, [1.0, 1.0, 1.0])).startswith("goal met")
    drifted = explain(_payload(False, [1.3, 1.0, 0.8], drift=1.5))
    assert "speed changed" in drifted and "1.30 -> 1.00 -> 0.80" in drifted
    assert "1.50x as long after" in drifted
    biased = explain(_payload(False, [1.3, 1.3, 1.3]))
    assert "off by +30%" in biased and "speed changed" not in biased
    assert "vary widely" in explain(_payload(False, [1.0, 1.0, 1.0], med=0.4))
    assert "scheduling" in explain(_payload(False, [1.0, 1.02, 0.99]))
    parts = thirds([{"seconds": s} for s in (1.0, 1.0, 1.0, 3.0)])
    assert [len(p) for p in parts] == [2, 1, 1]


def test_peak_running_counts_overlapping_lifetimes():
    from types import SimpleNamespace

    from ctxlab.sim.calibrate import peak_running

    spans = [SimpleNamespace(arrival=a, finish=f) for a, f in ((0, 2), (1, 3), (2, 4), (5, 6))]
    assert peak_running(spans) == 2  # a finish at 2 counts before the arrival at 2
    assert peak_running([]) == 0
