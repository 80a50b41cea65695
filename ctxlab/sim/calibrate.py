"""The simulator half of calibration: the trace, its token ids, the matching config, the verdict.

Calibration runs one small generated trace twice: through the real engine in real time
(outside this package; `ctxlab.engine.replay`) and through the simulator with a step profile
measured on the same machine. Both sides are summarised here with the same percentile
function, so the only thing compared is what each predicted for each request.

The simulator is configured from the engine's own settings, never from the result: page size
= the engine's block size, chunk budget = `max_num_batched_tokens`, most running requests =
`max_num_seqs`, pool = the engine's pool in tokens (times the architecture's bytes per token,
so the simulator's page count equals the engine's block count). The engine's scheduler walks
its running list in admission order, a decode taking one token and a prefill the next chunk
that fits; the simulator gives decodes their tokens first and prefill chunks the rest in
admission order. Because a request can only reach decode after every earlier one has finished
its prefill, the two orders pick the same tokens unless the decodes alone exceed the budget
(impossible here: max_num_seqs 64 < 4,096 tokens). Admission matches too: both admit
first-come-first-served at the start of a step and prefill the newcomer in that step.

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError
from ctxlab.inputs import load_json
from ctxlab.plan.compute import attended_keys
from ctxlab.plan.devices import custom_device
from ctxlab.sim.config import SimConfig
from ctxlab.sim.metrics import percentile
from ctxlab.sim.run import simulate
from ctxlab.sim.steptime import ArchCost, ProfileStepTime, StepLoad
from ctxlab.sim.synthetic import SyntheticSpec, generate
from ctxlab.sim.trace import Trace

GOAL = 0.20  # relative error of p50 TTFT and p50 TPOT the issue asks for

# Few hundred input tokens, tens of output tokens. The arrival rate is sized from the measured
# profile (`auto_rate`): a shared CPU's speed changes several-fold with its load, so a fixed
# rate would either leave the engine idle or swamp it.
DEFAULT_INPUT = "lognormal:192:0.35"
DEFAULT_OUTPUT = "uniform:8:32"
DEFAULT_LOAD = 1.5


@dataclass(frozen=True)
class EngineSettings:
    """The real engine's scheduler and pool configuration, as the simulator must mirror it."""

    pool_tokens: int
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True)
class RequestTimes:
    """Per-request outcome of one side, in trace order (seconds)."""

    ttft: np.ndarray
    tpot: np.ndarray  # NaN for requests with a single output token
    output_tokens: np.ndarray


def calibration_trace(
    n: int,
    seed: int,
    block_size: int,
    rate: float,
    input_len: str = DEFAULT_INPUT,
    output_len: str = DEFAULT_OUTPUT,
) -> Trace:
    """A seeded Poisson trace of `n` requests with hash blocks of the engine's block size.
    The rate only scales the gaps: the same seed gives the same lengths at any rate."""
    if n <= 0:
        raise CtxlabError(f"--requests must be positive, got {n}")
    if rate <= 0:
        raise CtxlabError(f"--rate must be positive, got {rate}")
    spec = SyntheticSpec(n=n, rate=rate, input=input_len, output=output_len, seed=seed)
    return generate(spec, block_tokens=block_size)


def solo_seconds(profile: str, input_len: int, output_len: int) -> float:
    """What the profile predicts one request alone takes: its prefill step, then one decode
    step per further output token."""
    model = ProfileStepTime(profile)
    pre = StepLoad(flop_keys=[attended_keys(input_len)], read_keys=[0], prefill_tokens=input_len)
    total = model.seconds(pre)
    for c in range(input_len, input_len + output_len - 1):
        dec = StepLoad(flop_keys=[c + 1], read_keys=[0], decode_tokens=1, decode_keys_full=c + 1)
        total += model.seconds(dec)
    return total


def auto_rate(
    profile: str, n: int, seed: int, block_size: int, load: float = DEFAULT_LOAD
) -> float:
    """Arrivals per second that offer `load` x the engine's solo capacity: the mean predicted
    solo time of the trace's requests is 1/rate at load 1. Batched decode is cheaper per
    token than solo, so the engine keeps up while requests still overlap."""
    if not 0 < load <= 4:
        raise CtxlabError(f"--load must be in (0, 4], got {load}")
    shape = calibration_trace(n, seed, block_size, rate=1.0)
    mean = float(
        np.mean([solo_seconds(profile, r.input_len, r.output_len) for r in shape.requests])
    )
    return load / mean


def token_ids(trace: Trace, vocab_size: int, seed: int) -> list[list[int]]:
    """Prompt token ids per request that agree with the trace's hash ids: one fixed random
    block of tokens per hash id, so equal ids (shared prefixes) are equal tokens and distinct
    ids are, with overwhelming odds, distinct blocks to the engine's prefix cache too."""
    low = min(1000, vocab_size // 4)  # skip the special and byte tokens at the bottom
    if vocab_size - low < 2:
        raise CtxlabError(f"a vocabulary of {vocab_size} tokens is too small to calibrate")
    cache: dict[int, np.ndarray] = {}
    out = []
    B = trace.block_tokens
    for r in trace.requests:
        ids: list[int] = []
        for i, key in enumerate(r.hash_ids):
            size = min(B, r.input_len - i * B)
            block = cache.get(key)
            if block is None or len(block) != size:
                rng = np.random.default_rng([seed, key, size])
                block = rng.integers(low, vocab_size, size=size)
                cache[key] = block
            ids.extend(int(t) for t in block)
        out.append(ids)
    return out


def sim_config(arch: ArchSpec, engine: EngineSettings, profile: str) -> tuple[SimConfig, int]:
    """The simulator configuration that mirrors `engine`, and the pool bytes it implies."""
    kv_per_token = ArchCost.build(arch, arch.weight_bytes).kv_bytes_per_token
    pool_bytes = engine.pool_tokens * kv_per_token
    cfg = SimConfig(
        page_size=engine.block_size,
        chunk_tokens=engine.max_num_batched_tokens,
        max_running=engine.max_num_seqs,
        pool_bytes=pool_bytes,
        profile=profile,
    )
    return cfg, pool_bytes


def simulate_trace(
    trace: Trace, arch: ArchSpec, engine: EngineSettings, profile: str
) -> tuple[RequestTimes, dict[str, float]]:
    """Run the simulator on `trace` with the measured profile; per-request times + metrics."""
    if trace.block_tokens % engine.block_size:
        raise CtxlabError("the calibration trace's hash blocks must be whole engine blocks")
    cfg, pool_bytes = sim_config(arch, engine, profile)
    # The device only sizes the pool when pool_bytes is absent and prices steps in roofline
    # mode; here the pool is given and the profile prices steps, so its numbers are unused.
    device = custom_device(1.0, 1.0, pool_bytes)
    res = simulate(trace, arch, device, cfg)
    seqs = sorted(res.seqs, key=lambda s: s.req.index)
    arrival = np.array([s.arrival for s in seqs])
    first = np.array([s.first_token for s in seqs])
    finish = np.array([s.finish for s in seqs])
    outs = np.array([s.req.output_len for s in seqs], dtype=np.int64)
    times = RequestTimes(first - arrival, _tpot(first, finish, outs), outs)
    return times, res.metrics


def _tpot(first: np.ndarray, finish: np.ndarray, outs: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(outs > 1, (finish - first) / np.maximum(outs - 1, 1), np.nan)


def engine_times(
    arrival: np.ndarray, first: np.ndarray, finish: np.ndarray, outs: np.ndarray
) -> RequestTimes:
    """The engine side's per-request times from absolute clocks (arrival = scheduled time)."""
    return RequestTimes(first - arrival, _tpot(first, finish, outs), outs)


def compare(real: RequestTimes, sim: RequestTimes, goal: float = GOAL) -> dict[str, object]:
    """p50/p95 TTFT and TPOT of both sides and the relative error of the p50s."""
    out: dict[str, object] = {}
    for name in ("ttft", "tpot"):
        for side, t in (("engine", real), ("sim", sim)):
            values = getattr(t, name)
            values = values[~np.isnan(values)]
            for p in (50, 95):
                out[f"{side}_{name}_p{p}"] = percentile(values, p)
        e, s = out[f"engine_{name}_p50"], out[f"sim_{name}_p50"]
        out[f"{name}_p50_rel_error"] = (s - e) / e if e > 0 else float("nan")  # type: ignore[operator]
    errors = [abs(out["ttft_p50_rel_error"]), abs(out["tpot_p50_rel_error"])]  # type: ignore[arg-type]
    out["goal"] = goal
    out["goal_met"] = bool(all(err <= goal for err in errors))
    return out


def step_prediction(profile: str, steps: list[dict]) -> dict[str, float]:
    """How well the profile's fitted model predicts steps the engine measured elsewhere (the
    replay): median absolute relative error, and total predicted / total measured time."""
    model = ProfileStepTime(profile)
    if not steps:
        return {"steps": 0, "median_abs_rel_error": float("nan"), "total_ratio": float("nan")}
    pred, real = [], []
    for st in steps:
        pk, dk = int(st["prefill_keys"]), int(st["decode_keys"])
        load = StepLoad(
            flop_keys=[pk + dk],
            read_keys=[0],
            prefill_tokens=int(st["prefill_tokens"]),
            decode_tokens=int(st["decode_tokens"]),
            decode_keys_full=dk,
        )
        pred.append(model.seconds(load))
        real.append(float(st["seconds"]))
    p, r = np.array(pred), np.array(real)
    return {
        "steps": len(steps),
        "median_abs_rel_error": float(np.median(np.abs(p - r) / r)),
        "total_ratio": float(p.sum() / r.sum()),
    }


def fit_summary(path: Path) -> dict[str, float]:
    """The fitted linear step model of a profile and how well it fits its own steps."""
    model = ProfileStepTime(path)
    steps = load_json(path, "step profile")["steps"]  # type: ignore[index]
    self_fit = step_prediction(str(path), steps)
    c = model.coef
    return {
        "ms_per_step": c[0] * 1e3,
        "ms_per_prefill_token": c[1] * 1e3,
        "us_per_prefill_key": c[2] * 1e6,
        "ms_per_decode_token": c[3] * 1e3,
        "us_per_decode_key": c[4] * 1e6,
        "fit_median_abs_rel_error": self_fit["median_abs_rel_error"],
    }


def after_over_before(profile: Path) -> float | None:
    """Total time of the profile's steps measured after the replay over those before (the
    same design, so the same step shapes): how much the machine's speed moved."""
    steps = load_json(profile, "step profile")["steps"]  # type: ignore[index]
    before = sum(s["seconds"] for s in steps if s.get("phase") == "before")
    after = sum(s["seconds"] for s in steps if s.get("phase") == "after")
    return after / before if before > 0 and after > 0 else None


def thirds(steps: list[dict]) -> list[list[dict]]:
    """The replay's steps split into three spans of equal busy time (by each step's middle)."""
    total = sum(s["seconds"] for s in steps)
    parts: list[list[dict]] = [[], [], []]
    acc = 0.0
    for s in steps:
        parts[min(2, int(3 * (acc + s["seconds"] / 2) / total))].append(s)
        acc += s["seconds"]
    return parts


class Span(Protocol):
    """A replayed request's lifetime (the engine's `ReplayedRequest` has these)."""

    arrival: float
    finish: float


def peak_running(reqs: Sequence[Span]) -> int:
    """Most requests in the engine at once (arrival to finish). The pool and max_num_seqs
    never bind in calibration, so that is the running count the simulator reports."""
    events = sorted(
        [(r.arrival, 1) for r in reqs] + [(r.finish, -1) for r in reqs], key=lambda e: (e[0], e[1])
    )
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def explain(p: dict[str, Any]) -> str:
    """Why the errors are what they are, read off the diagnostics (no numbers are tuned)."""
    pred = p["replay_step_prediction"]
    ratio, med = pred["total_ratio"], pred["median_abs_rel_error"]
    by_third = pred["total_ratio_by_third"]
    desc = (
        f"the profile predicts the replay's {pred['steps']} steps at {ratio:.2f}x their "
        f"measured time ({', '.join(f'{t:.2f}x' for t in by_third)} by third of the replay; "
        f"median step error {med:.0%})"
    )
    if p["goal_met"]:
        return f"goal met; {desc}"
    reasons = []
    drift = p.get("profile_after_over_before")
    if max(by_third) / min(by_third) > 1.15:
        path = " -> ".join(f"{t:.2f}" for t in by_third)
        reasons.append(
            f"the machine's speed changed during the replay (predicted/measured step time went "
            f"{path} by third; other processes share the CPU), and queueing turns a slower or "
            "faster stretch into more or less batching"
        )
    if drift is not None and abs(drift - 1) > 0.15:
        reasons.append(
            f"the same profile steps took {drift:.2f}x as long after the replay as before"
        )
    if abs(ratio - 1) > 0.10:
        reasons.append(f"the step model is off by {ratio - 1:+.0%} on average, and queueing "
                       "amplifies that in TTFT")  # fmt: skip
    if med > 0.25:
        reasons.append("single steps vary widely, so per-request latencies are noisy")
    if not reasons:
        reasons.append("step times are predicted well, so the gap comes from scheduling or "
                       "timing that the simulator does not model")  # fmt: skip
    return f"goal missed: {'; '.join(reasons)}. Evidence: {desc}"
