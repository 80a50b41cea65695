"""One simulation run end to end: a trace and a setup in, a result record out.

Colocated mode is one `Simulator`. Disaggregated mode runs a prefill instance first (each
request leaves it after its prompt is computed) and then a decode instance on which each
request arrives when its KV has crossed the transfer link (one link, requests in the order
they finish prefill; whole pages cross it); the decode instance holds no prefix cache and
emits every output token, the first included: the prefill side's token is discarded, as a
P/D proxy and `ctxlab serve --disaggregated` do, so TTFT includes the transfer, the wait on
the link and the decode side's first step (measured against real processes in
benchmarks/disagg_vs_colocated.py). The prefill side does not feel back-pressure from a
full decode side: a stated simplification.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError
from ctxlab.plan.devices import Device
from ctxlab.sim.bounds import check_memory
from ctxlab.sim.config import Setup, SimConfig, resolve
from ctxlab.sim.engine import Simulator
from ctxlab.sim.metrics import summarize
from ctxlab.sim.state import Counters, Seq, Timeline
from ctxlab.sim.steptime import (
    ProfileStepTime,
    RooflineStepTime,
    ScaledStepTime,
    StepTime,
)
from ctxlab.sim.trace import Trace


@dataclass
class SimResult:
    """Figures of one run plus what the plots need."""

    metrics: dict[str, float]
    counters: Counters
    timeline: Timeline
    setup: Setup
    step_model: str
    decode_timeline: Timeline | None = None
    seqs: list[Seq] = field(default_factory=list)


def make_step_time(setup: Setup, gpus: int) -> StepTime:
    cfg = setup.config
    step: StepTime
    if cfg.profile:
        step = ProfileStepTime(cfg.profile)
    else:
        step = RooflineStepTime(
            setup.cost,
            setup.device,
            gpus=gpus,
            compute_efficiency=cfg.compute_efficiency,
            memory_efficiency=cfg.memory_efficiency,
            overhead_s=cfg.step_overhead,
        )
    return step if cfg.step_scale == 1 else ScaledStepTime(step, cfg.step_scale)


def simulate(
    trace: Trace, arch: ArchSpec, device: Device, config: SimConfig, check: bool = False
) -> SimResult:
    """Replay `trace` on `arch` x `device` under `config` (refused up front when the run
    would not fit in this machine's memory: `bounds.check_memory`)."""
    check_memory(trace)
    trace = trace.time_scaled(config.time_scale)
    if config.disaggregated:
        return _disaggregated(trace, arch, device, config, check)
    setup = resolve(arch, device, config)
    step = make_step_time(setup, config.gpus)
    sim = Simulator(setup, step, trace.block_tokens, check=check)
    done = sim.run([(r, r.arrival) for r in trace.requests])
    return _result(trace, setup, step.label, sim, done, done, sim.counters, None)


def _disaggregated(
    trace: Trace, arch: ArchSpec, device: Device, config: SimConfig, check: bool
) -> SimResult:
    pre_setup = resolve(arch, device, config, gpus=config.prefill_gpus)
    dec_setup = resolve(arch, device, replace(config, offload_bytes=0), gpus=config.gpus)
    pre_step = make_step_time(pre_setup, config.prefill_gpus)
    dec_step = make_step_time(dec_setup, config.gpus)
    pre = Simulator(pre_setup, pre_step, trace.block_tokens, prefill_only=True, check=check)
    first = pre.run([(r, r.arrival) for r in trace.requests])
    link, jobs = 0.0, []
    by_index = {}
    page = config.page_size
    for s in sorted(first, key=lambda q: (q.finish, q.req.index)):
        tokens = -(-s.req.input_len // page) * page  # the link carries whole pages
        nbytes = dec_setup.cost.kv_bytes_per_token * tokens + dec_setup.cost.state_bytes
        link = max(link, s.finish) + nbytes / config.kv_transfer_bandwidth
        by_index[s.req.index] = s
        jobs.append((s.req, link))
    dec = Simulator(dec_setup, dec_step, trace.block_tokens, prefix_reuse=False, check=check)
    second = dec.run(jobs, prefilled=True)
    # stitch: arrival and admission from the prefill side, every token from the decode side
    merged: list[Seq] = []
    for s in second:
        p = by_index[s.req.index]
        s.arrival, s.admitted_at = p.arrival, p.admitted_at
        merged.append(s)
    counters = pre.counters
    counters.decode_tokens_run += dec.counters.decode_tokens_run
    counters.tokens_emitted = dec.counters.tokens_emitted  # the prefill side's are discarded
    counters.preemptions += dec.counters.preemptions
    counters.prefill_tokens_run += dec.counters.prefill_tokens_run
    counters.steps += dec.counters.steps
    counters.peak_running = max(counters.peak_running, dec.counters.peak_running)
    label = f"prefill {pre_step.label}; decode {dec_step.label}"
    res = _result(trace, pre_setup, label, pre, merged, second, counters, dec)
    return res


def _result(trace, setup, label, sim, seqs, itl_seqs, counters, dec) -> SimResult:
    if len(seqs) != len(trace.requests):
        raise AssertionError("a request was lost or duplicated")
    seqs = sorted(seqs, key=lambda q: q.req.index)
    arr = np.array([s.arrival for s in seqs])
    itl = sim.timeline.itl_samples() if dec is None else dec.timeline.itl_samples()
    metrics = summarize(
        arr,
        np.array([s.first_token for s in seqs]),
        np.array([s.finish for s in seqs]),
        np.array([s.admitted_at for s in seqs]),
        np.array([s.req.output_len for s in seqs], dtype=np.float64),
        itl,
        setup.config.slo_ttft,
        setup.config.slo_tpot,
    )
    c = counters
    c.recomputed_tokens = c.prefill_tokens_run - c.computed_tokens
    pool = sim.pool
    metrics.update(
        requests_completed=len(seqs),
        queried_tokens=c.queried_tokens,
        reused_tokens=c.reused_tokens,
        reused_token_fraction=c.reused_tokens / c.queried_tokens if c.queried_tokens else 0.0,
        reused_from_tier_tokens=c.reused_tier_tokens,
        computed_tokens=c.computed_tokens,
        recomputed_tokens=c.recomputed_tokens,
        hit_requests=c.hit_requests,
        evictions=pool.evicted_blocks,
        evicted_pages=pool.evicted_pages,
        tier_dropped_blocks=pool.tier_dropped_blocks,
        offload_transfer_bytes=c.transfer_bytes,
        preemptions=c.preemptions,
        peak_running_requests=c.peak_running,
        steps=c.steps,
        pool_bytes=setup.pool_bytes if setup.pool_bytes is not None else -1,
        page_bytes=setup.page_bytes,
    )
    if dec is not None:
        metrics["decode_pool_bytes"] = dec.setup.pool_bytes or -1
    if c.queried_tokens == 0 and any(True for _ in trace.requests):
        raise CtxlabError("the simulation queried no tokens")
    return SimResult(
        metrics, c, sim.timeline, setup, label, None if dec is None else dec.timeline, seqs
    )
