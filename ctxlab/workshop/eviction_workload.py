"""The eviction workload: prefix groups whose prefixes overflow the pool, run on the engine
and replayed by the simulator (demonstration 4's measurement, reused by demonstration 8 and
by demonstration 4's server variant).

Several prefix groups (think tenants' system prompts) each send a few requests, each its
group's prefix plus an own suffix. Grouped (A A A B B B ...) or interleaved (A B C A B C ...)
arrival orders run every request at once, first come first served with at most
`concurrency` running. The engine side counts from the pool and the requests' own metrics;
the simulator side replays the same list with the engine's settings and a step profile. Both
return a `SideRun`: frozen counts and times, no formatting.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from ctxlab.workshop.config import Pos, Section
from ctxlab.workshop.measure import Timer, pct

if TYPE_CHECKING:
    from ctxlab.engine import LLMEngine
    from ctxlab.engine.profile import Design
    from ctxlab.workshop.result import Figures
    from ctxlab.workshop.session import Session


ORDERS = ("grouped", "interleaved")


class EvictionSection(Section):
    """The workload's `[eviction]` table (demonstration 4's section, read by 8 as well)."""

    groups: Annotated[int, Field(ge=2)]
    requests_per_group: Annotated[int, Field(ge=2)]
    prefix_tokens: Pos
    suffix_tokens: Pos
    output_tokens: Pos
    pool_share: Annotated[float, Field(gt=0, lt=1)]
    concurrency: Pos
    profile: str = Field(min_length=1)


@dataclass(frozen=True)
class Job:
    group: int
    member: int
    ids: list[int]
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class SideRun:
    """One request list on one side (engine, simulator or server): exact token and block
    counts, every request's TTFT, and what the side could tell about its own work."""

    reused: int
    queried: int
    hit_requests: int
    evictions: int
    preemptions: int
    ttft_ms: tuple[float, ...]
    makespan_s: float
    peak_running: int
    cpu_s: float | None = None  # the engine's process CPU seconds; None when modeled
    tokens: tuple[tuple[int, ...], ...] = ()  # the engine's output tokens per request
    transfer_bytes: int = 0  # the simulator's offload tier
    restored: int = 0

    @property
    def computed(self) -> int:
        return self.queried - self.reused

    def recomputed(self, unique: int) -> int:
        """Prompt tokens computed although an earlier request had computed them."""
        return self.computed - unique

    def ttft_p(self, q: float) -> float:
        return pct(self.ttft_ms, q)

    def as_dict(self, unique: int) -> dict:
        """The run with its derived counts, keyed by name (for readers not yet typed)."""
        out = asdict(self)
        out["ttft_ms"] = list(self.ttft_ms)
        out["tokens"] = [list(t) for t in self.tokens]
        out["computed"] = self.computed
        out["recomputed"] = self.recomputed(unique)
        for q in (50, 95, 99):
            out[f"ttft_p{q}"] = self.ttft_p(q)
        return out


@dataclass(frozen=True)
class StepProfile:
    """The simulator's step times: a file the config named, or one measured in this run
    (`steps` engine steps in `seconds`). Where the file lies follows from the config
    (`profile_path`), so the record holds no path."""

    source: Literal["named", "measured"]
    # the named file's own label, as whoever wrote the file wrote it (text the run read,
    # not formatted here); "" when measured
    file_label: str = ""
    steps: int | None = None
    seconds: float | None = None


def profile_path(session: Session, ev: EvictionSection) -> Path:
    """The step-profile file the simulator reads: the one the config names, or the run's
    `step-profile.json` that `step_profile` writes."""
    return Path(ev.profile) if ev.profile != "measure" else session.out / "step-profile.json"


def profile_label(figures: Figures, p: StepProfile) -> str:
    """How a table note names the step profile (its numbers recorded as figures); the
    sentence demonstrations 4 and 8 both print."""
    if p.steps is None:
        return p.file_label
    f = figures
    return (
        f"a profile of {f.say('profile_steps', p.steps)} engine steps shaped like these "
        f"requests, measured on this machine just before ({f.say('profile_s', p.seconds, 1)} s)"
    )


def pool_tokens(ev: EvictionSection, page: int) -> int:
    """The pool: `pool_share` of the groups' prefixes, in whole pages."""
    tokens = ev.pool_share * ev.groups * ev.prefix_tokens
    return max(page, -(-int(tokens) // page) * page)


def unique_tokens(ev: EvictionSection, jobs: list[Job]) -> int:
    """Prompt tokens no earlier request had computed: each prefix once, every suffix."""
    return ev.groups * ev.prefix_tokens + len(jobs) * ev.suffix_tokens


def build_jobs(session: Session, ev: EvictionSection, page: int) -> list[Job]:
    """Each group's prefix, then one own suffix per request; hash ids for the simulator name
    the same blocks the engine's prefix cache sees (one id per page)."""
    prefixes = [session.text_ids(ev.prefix_tokens) for _ in range(ev.groups)]
    fresh = 1_000_000
    jobs = []
    for g in range(ev.groups):
        for m in range(ev.requests_per_group):
            ids = prefixes[g] + session.text_ids(ev.suffix_tokens)
            n_blocks = -(-len(ids) // page)
            prefix_blocks = ev.prefix_tokens // page
            own = tuple(range(fresh, fresh + n_blocks - prefix_blocks))
            fresh += len(own)
            hashes = tuple(g * 10_000 + b for b in range(prefix_blocks)) + own
            jobs.append(Job(g, m, ids, hashes))
    return jobs


def ordered(jobs: list[Job], order: str) -> list[Job]:
    key = (lambda j: (j.group, j.member)) if order == "grouped" else (lambda j: (j.member, j.group))
    return sorted(jobs, key=key)


def profile_design(ev: EvictionSection) -> Design:
    """A step-profile design shaped like the workload's own steps: whole requests
    prefilled cold, suffixes prefilled after a cached prefix, decodes of one to
    `concurrency` requests at the requests' length, and a prefill beside running decodes."""
    from ctxlab.engine.profile import Design

    request = ev.prefix_tokens + ev.suffix_tokens
    return Design(
        prefill=((request, 1), (ev.suffix_tokens, max(2, request // ev.suffix_tokens))),
        decode_contexts=(request,),
        decode_batches=tuple(sorted({1, 2, ev.concurrency})),
        decode_steps=3,
        mixed_batch=(max(1, ev.concurrency - 1),),
        mixed_context=request,
        mixed_prompts=(ev.suffix_tokens, request),
    )


def step_profile(session: Session, ev: EvictionSection) -> StepProfile:
    """The simulator's step-time profile: the file the config names, or measured here now
    (written to the run's `step-profile.json`); `profile_path` says where it lies."""
    from ctxlab.engine.profile import measure, profile_document, warm_up
    from ctxlab.sim.steptime import ProfileStepTime

    if ev.profile != "measure":
        label = ProfileStepTime(Path(ev.profile)).label  # a bad file is one sentence
        return StepProfile("named", label)
    design = profile_design(ev)
    e = session.cfg.engine
    llm = session.llm(
        pool_tokens=design.max_tokens() + e.page_size,
        warm_up=False,
        max_num_batched_tokens=e.max_num_batched_tokens,
    )
    vocab = session.loaded.config.vocab_size
    with Timer() as t:
        warm_up(llm.engine, vocab, session.cfg.model.seed)
        measured = measure(llm.engine, design, vocab, session.cfg.model.seed)
    doc = profile_document(
        measured, session.cfg.model.source, session.cfg.model.dtype, llm.engine, "workshop eviction"
    )
    path = profile_path(session, ev)
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return StepProfile("measured", steps=len(measured), seconds=t.wall_s)


def run_engine(
    session: Session,
    ev: EvictionSection,
    jobs: list[Job],
    pool: int,
    setup: Callable[[LLMEngine], None] | None = None,
) -> SideRun:
    """Every job added at once, stepped to the end; the pool's and requests' own counts.
    `setup` is handed the engine first (demonstration 8 attaches its offload tier there)."""
    from ctxlab.engine import SamplingParams

    e = session.cfg.engine
    llm = session.llm(
        pool_tokens=pool,
        max_num_seqs=ev.concurrency,
        warm_up=False,
        max_num_batched_tokens=e.max_num_batched_tokens,
    )
    engine = llm.engine
    if setup is not None:
        setup(engine)
    before = engine.stats()
    params = SamplingParams(max_tokens=ev.output_tokens, ignore_eos=True)
    with Timer() as t:
        rids = [engine.add_request(j.ids, params) for j in jobs]
        peak = 0
        while engine.has_unfinished():
            engine.step()
            peak = max(peak, len(engine.scheduler.running))
    tokens = tuple(tuple(engine.output(r).token_ids) for r in rids)
    outs = [engine.output(r).metrics for r in rids]
    after = engine.stats()
    start = min(m.arrival_time for m in outs)
    return SideRun(
        reused=sum(m.reused_tokens for m in outs),
        queried=sum(m.prompt_tokens for m in outs),
        hit_requests=sum(1 for m in outs if m.reused_tokens > 0),
        evictions=after.cached_blocks_evicted - before.cached_blocks_evicted,
        preemptions=sum(m.preemptions for m in outs),
        ttft_ms=tuple(m.ttft * 1e3 for m in outs),
        makespan_s=max(m.finish_time for m in outs) - start,
        peak_running=peak,
        cpu_s=t.cpu_s,
        tokens=tokens,
    )


def run_simulator(
    session: Session,
    ev: EvictionSection,
    jobs: list[Job],
    pool: int,
    profile: Path,
    **options: float,
) -> SideRun:
    """The same request list through `ctxlab.sim` with the engine's own settings (plus
    `options` for `SimConfig`: demonstration 8's offload tier)."""
    from ctxlab.plan.devices import custom_device
    from ctxlab.sim.config import SimConfig
    from ctxlab.sim.run import simulate
    from ctxlab.sim.steptime import ArchCost
    from ctxlab.sim.trace import Request, Trace

    e = session.cfg.engine
    arch = session.arch()
    reqs = [Request(i, 0.0, len(j.ids), ev.output_tokens, j.hash_ids) for i, j in enumerate(jobs)]
    trace = Trace("workshop eviction", reqs, block_tokens=e.page_size)
    pool_bytes = pool * ArchCost.build(arch, arch.weight_bytes).kv_bytes_per_token
    cfg = SimConfig(
        page_size=e.page_size,
        chunk_tokens=e.max_num_batched_tokens,
        max_running=ev.concurrency,
        pool_bytes=pool_bytes,
        profile=str(profile),
        **options,  # type: ignore[arg-type]
    )
    res = simulate(trace, arch, custom_device(1.0, 1.0, pool_bytes), cfg)
    m = res.metrics
    seqs = sorted(res.seqs, key=lambda s: s.req.index)
    return SideRun(
        reused=int(m["reused_tokens"]),
        queried=int(m["queried_tokens"]),
        hit_requests=int(m["hit_requests"]),
        evictions=int(m["evictions"]),
        preemptions=int(m["preemptions"]),
        ttft_ms=tuple((s.first_token - s.arrival) * 1e3 for s in seqs),
        makespan_s=float(m["makespan_s"]),
        peak_running=int(m["peak_running_requests"]),
        transfer_bytes=int(m.get("offload_transfer_bytes", 0) or 0),
        restored=int(m.get("reused_from_tier_tokens", 0) or 0),
    )
