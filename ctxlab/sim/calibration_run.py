"""Calibration (`ctxlab simulate --calibrate`): one generated trace through the real engine
and through the simulator, compared request by request.

Steps: load the model and build the engine (torch threads pinned); measure a step profile
(or load the one given); size the arrival rate from it; replay the trace through the engine
in real time; simulate the same trace with the profile and the engine's configuration;
compare p50/p95 TTFT and TPOT. The profile's prediction of the replay's own measured steps is
reported too: it separates "the step model was off" (e.g. the machine's load changed
between the profile and the replay) from "the scheduling model was off".

The arithmetic (trace, rate, verdict, diagnosis) is `ctxlab.sim.calibrate`'s and the
torch-needing steps are the engine's (`ctxlab.engine.profile`: open the engine, measure a
profile; `ctxlab.engine.replay`); this module only runs them in order. It is the one sim
module that drives the engine, and it imports the engine inside `run_calibration` only, so
importing it (or anything in `ctxlab/sim`) never loads torch; the engine may not import the
simulator (it sits a layer below).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ctxlab.arch import ArchSpec, resolve_arch
from ctxlab.errors import CtxlabError
from ctxlab.progress import progress
from ctxlab.sim import calibrate as cal
from ctxlab.sim.steptime import ProfileStepTime

# The engine's own defaults (`LLMEngine`): the configuration calibration checks.
SETTINGS = cal.EngineSettings(
    pool_tokens=32768, block_size=16, max_num_batched_tokens=4096, max_num_seqs=64
)


def _arch_for(source: Path) -> ArchSpec:
    if source.is_dir():
        return resolve_arch(config=source / "config.json")
    return resolve_arch(gguf=source)


def run_calibration(
    requests: int,
    seed: int,
    profile: Path | None,
    model: str,
    threads: int,
    rate: float | None,
    out: Path,
    show_progress: bool = False,
    quick_profile: bool = True,
    dtype: str = "float32",
) -> dict[str, Any]:
    """Everything `--calibrate` reports, as one dict; files go to `out`. Without `profile`
    one is measured before the replay and again after it, so the file brackets the run."""
    if requests <= 0:
        raise CtxlabError(f"--requests must be positive, got {requests}")
    if threads <= 0:
        raise CtxlabError(f"--threads must be positive, got {threads}")
    if profile is not None:
        ProfileStepTime(profile)  # a bad file fails here, before the model loads
    from ctxlab.engine.profile import measure_profile, open_engine, warm_up
    from ctxlab.engine.replay import TimedRequest, replay

    settings = SETTINGS
    loaded, engine = open_engine(
        model,
        dtype,
        threads,
        settings.pool_tokens,
        settings.block_size,
        settings.max_num_batched_tokens,
        settings.max_num_seqs,
    )
    out.mkdir(parents=True, exist_ok=True)
    vocab = loaded.config.vocab_size
    bracket = profile is None
    if profile is None:
        profile = out / "step-profile.json"
        first = measure_profile(
            loaded, engine, model, dtype, quick_profile, profile, seed, show_progress
        )
    else:
        warm_up(engine, vocab, seed)
    arch = _arch_for(Path(loaded.source_path))
    if rate is None:
        rate = cal.auto_rate(str(profile), requests, seed, settings.block_size)
    trace = cal.calibration_trace(requests, seed, settings.block_size, rate)
    prompts = cal.token_ids(trace, vocab, seed)
    jobs = [TimedRequest(r.arrival, prompts[i], r.output_len) for i, r in enumerate(trace.requests)]
    span = trace.requests[-1].arrival
    with progress(
        f"replaying {len(jobs)} requests over {span:.0f} s in real time",
        total=len(jobs),
        enabled=show_progress,
    ) as bar:
        res = replay(engine, jobs, on_finish=lambda _j: bar.advance())
    bad = [
        i
        for i, (r, job) in enumerate(zip(res.requests, jobs, strict=True))
        if r.completions != 1 or r.output_tokens != job.max_tokens
    ]
    if bad:
        raise AssertionError(f"requests {bad} did not complete exactly once with all tokens")
    if bracket:  # measure again after the replay: the profile brackets it in time
        measure_profile(
            loaded,
            engine,
            model,
            dtype,
            quick_profile,
            profile,
            seed + 1,
            show_progress,
            earlier=first,
        )
    real = cal.engine_times(
        np.array([r.arrival for r in res.requests]),
        np.array([r.first_token for r in res.requests]),
        np.array([r.finish for r in res.requests]),
        np.array([r.output_tokens for r in res.requests]),
    )
    sim_times, sim_metrics = cal.simulate_trace(trace, arch, settings, str(profile))
    verdict = cal.compare(real, sim_times)
    steps = [asdict(s) for s in res.steps]
    prediction = cal.step_prediction(str(profile), steps)
    by_third = [cal.step_prediction(str(profile), part) for part in cal.thirds(steps)]
    prediction["total_ratio_by_third"] = [t["total_ratio"] for t in by_third]
    busy = sum(s["seconds"] for s in steps)
    payload: dict[str, Any] = {
        "model": model,
        "arch": arch.name,
        "profile": str(profile),
        "torch_threads": threads,
        "requests": len(jobs),
        "seed": seed,
        "rate_per_s": rate,
        "input_tokens_mean": trace.input_tokens / len(jobs),
        "output_tokens_mean": trace.output_tokens / len(jobs),
        "engine": asdict(settings),
        "engine_steps": len(steps),
        "sim_steps": int(sim_metrics["steps"]),
        "engine_wall_s": res.wall_s,
        "engine_busy_fraction": busy / res.wall_s if res.wall_s > 0 else float("nan"),
        "engine_peak_running": cal.peak_running(res.requests),
        "sim_peak_running": int(sim_metrics["peak_running_requests"]),
        "engine_preemptions": sum(r.preemptions for r in res.requests),
        "sim_preemptions": int(sim_metrics["preemptions"]),
        "replay_step_prediction": prediction,
        "profile_after_over_before": cal.after_over_before(profile) if bracket else None,
        **verdict,
    }
    payload["why"] = cal.explain(payload)
    rows = [
        {
            "arrival": r.arrival,
            "input_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "engine_ttft": float(real.ttft[i]),
            "sim_ttft": float(sim_times.ttft[i]),
            "engine_tpot": float(real.tpot[i]),
            "sim_tpot": float(sim_times.tpot[i]),
        }
        for i, r in enumerate(res.requests)
    ]
    report = out / "calibration.json"
    report.write_text(
        json.dumps({**payload, "per_request": rows, "engine_steps_measured": steps}, indent=1),
        encoding="utf-8",
    )
    payload["report"] = str(report)
    return payload
