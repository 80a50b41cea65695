"""Step-time models and disaggregated mode."""

from __future__ import annotations

import json

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.sim.config import SimConfig
from ctxlab.sim.run import simulate
from ctxlab.sim.steptime import PROFILE_FORMAT, ProfileStepTime
from ctxlab.sim.synthetic import generate_from_spec


def test_profile_fit_recovers_a_linear_step_time(tmp_path, llama8b, h100):
    def truth(pt, pk, dt, dk):
        return 0.002 + 1e-5 * pt + 2e-9 * pk + 3e-5 * dt + 1e-8 * dk

    steps = []
    for pt, dt, ctx in [(512, 0, 0), (256, 4, 1000), (0, 8, 3000), (1024, 2, 500), (0, 1, 10)]:
        pk, dk = pt * (pt + 1) // 2, dt * (ctx + 1)
        feats = {"prefill_tokens": pt, "prefill_keys": pk, "decode_tokens": dt, "decode_keys": dk}
        steps.append({**feats, "seconds": truth(pt, pk, dt, dk)})
    steps.append(
        {
            **steps[0],
            "prefill_tokens": 2048,
            "prefill_keys": 2048 * 2049 // 2,
            "seconds": truth(2048, 2048 * 2049 // 2, 0, 0),
        }
    )
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": PROFILE_FORMAT, "steps": steps}))
    model = ProfileStepTime(path)
    assert model.coef == pytest.approx([0.002, 1e-5, 2e-9, 3e-5, 1e-8], rel=1e-4, abs=1e-12)
    trace = generate_from_spec("n=40,rate=10,input=300,output=20")
    res = simulate(trace, llama8b, h100, SimConfig(unlimited=True, profile=str(path)))
    assert res.step_model.startswith("profile p.json")
    path.write_text(json.dumps({"format": "other", "steps": steps}))
    with pytest.raises(CtxlabError, match="format"):
        ProfileStepTime(path)


def test_disaggregated_pays_a_transfer_and_conserves(llama8b, h100):
    trace = generate_from_spec("n=80,rate=20,groups=2,input=uniform:100:2000,output=uniform:1:50")
    colo = simulate(trace, llama8b, h100, SimConfig(unlimited=True))
    slow = SimConfig(unlimited=True, disaggregated=True, kv_transfer_bandwidth=1e9)
    res = simulate(trace, llama8b, h100, slow, check=True)
    assert sorted(s.req.index for s in res.seqs) == list(range(len(trace)))
    assert res.counters.tokens_emitted == trace.output_tokens
    assert res.metrics["reused_tokens"] == colo.metrics["reused_tokens"]
    fast = simulate(trace, llama8b, h100, slow.with_(kv_transfer_bandwidth=1e12))
    assert res.metrics["e2e_mean"] > fast.metrics["e2e_mean"]


def test_disaggregated_ttft_includes_the_transfer(llama8b, h100):
    """The decode side emits the first token, so a slower link delays TTFT by at least one
    request's transfer time (whole pages)."""
    trace = generate_from_spec("n=20,rate=2,groups=20,input=uniform:1000:2000,output=uniform:2:20")
    slow = SimConfig(unlimited=True, disaggregated=True, kv_transfer_bandwidth=1e8)
    fast = slow.with_(kv_transfer_bandwidth=1e12)
    a = simulate(trace, llama8b, h100, slow)
    b = simulate(trace, llama8b, h100, fast)
    per_token = a.setup.cost.kv_bytes_per_token
    shortest = min(-(-r.input_len // 16) * 16 for r in trace.requests) * per_token
    assert a.metrics["ttft_p50"] - b.metrics["ttft_p50"] >= shortest / 1e8 * 0.99


def test_step_scale_stretches_every_step_and_the_queue_amplifies_it(llama8b, h100):
    """A lone request's TTFT and E2E scale exactly; under load p50 TTFT moves by more than the
    scale (queueing), which is why a prediction is read beside a slower and faster step."""
    lone = generate_from_spec("n=1,rate=1,input=2000,output=50")
    base = simulate(lone, llama8b, h100, SimConfig(unlimited=True))
    slow = simulate(lone, llama8b, h100, SimConfig(unlimited=True, step_scale=1.1))
    for key in ("ttft_p50", "e2e_p50"):
        assert slow.metrics[key] == pytest.approx(1.1 * base.metrics[key], rel=1e-9)
    assert slow.step_model.endswith("every step x 1.1")
    busy = generate_from_spec("n=300,rate=40,input=4000,output=100,seed=1")
    cfg = SimConfig(unlimited=True, chunk_tokens=2048, max_running=64)
    runs = [simulate(busy, llama8b, h100, cfg.with_(step_scale=s)) for s in (1.0, 1.1)]
    ratio = runs[1].metrics["ttft_p50"] / runs[0].metrics["ttft_p50"]
    assert ratio > 1.1, f"p50 TTFT moved only x{ratio:.3f} for steps x1.1"
    with pytest.raises(CtxlabError, match="step-time scale must be a positive number"):
        SimConfig(step_scale=0)


def test_a_profile_prices_its_own_steps_with_its_fit(tmp_path):
    steps = [
        {"prefill_tokens": pt, "prefill_keys": pt * (pt + 1) // 2, "decode_tokens": dt,
         "decode_keys": dt * 300, "seconds": 0.01 + 0.001 * pt + 0.002 * dt}
        for pt, dt in [(64, 0), (128, 0), (0, 4), (0, 8), (32, 2), (256, 1)]
    ]  # fmt: skip
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": PROFILE_FORMAT, "steps": steps}))
    fit = ProfileStepTime(path)
    for s in steps:
        assert fit.price(s) == pytest.approx(s["seconds"], rel=1e-6)
