"""Demonstration 4: forced eviction with interleaved prefixes, on the engine and the simulator.

Several prefix groups (think tenants' system prompts) each send a few requests; the pool
holds only a share of the groups' prefixes. Arriving grouped (A A A B B B ...), a group's
later requests find its prefix still cached; interleaved (A B C D A B C D ...), the LRU
queue evicts each prefix before its group comes back, and the same requests recompute it.
Both orders run on the real engine and, on the same request list, on the simulator with a
step-time profile measured on this machine, side by side. All requests arrive together and
are served first come first served with at most `concurrency` running, so TTFT includes the
queue: the p99 is the last requests' wait.

Every TTFT percentile is printed with the requests it comes from and its 95 % bootstrap
interval; grouped against interleaved is a comparison of two runs (each side resampled on
its own), the simulator against the engine one over the same requests in the same order
(paired), each with the verdict its interval gives (`latency_stats`). Token and block
counts are exact.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from ctxlab.errors import CtxlabError
from ctxlab.progress import Tracker
from ctxlab.workshop import latency_stats
from ctxlab.workshop.config import CommonConfig, Pos, Section, fits
from ctxlab.workshop.demonstration import Demonstration, FigureValues, Metric, Risk
from ctxlab.workshop.measure import Timer, pct
from ctxlab.workshop.result import Column, DemoResult, Gain, Table, fmt
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from ctxlab.engine import LLMEngine


ORDERS = ("grouped", "interleaved")


@dataclass(frozen=True)
class Job:
    group: int
    member: int
    ids: list[int]
    hash_ids: tuple[int, ...]


def steps(session: Session) -> int:
    return 1 + 2 * len(ORDERS)


def build_jobs(session: Session) -> list[Job]:
    """Each group's prefix, then one own suffix per request; hash ids for the simulator name
    the same blocks the engine's prefix cache sees (one id per page)."""
    ev, page = DEMO.config(session.cfg), session.cfg.engine.page_size
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


def profile_design(session: Session):
    """A step-profile design shaped like this demonstration's own steps: whole requests
    prefilled cold, suffixes prefilled after a cached prefix, decodes of one to
    `concurrency` requests at the requests' length, and a prefill beside running decodes."""
    from ctxlab.engine.profile import Design

    ev = DEMO.config(session.cfg)
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


def step_profile(session: Session, res: DemoResult) -> tuple[Path, str]:
    """The simulator's step-time profile: measured here now, or the file the config names;
    the path and a label for the table note (its numbers recorded as figures)."""
    from ctxlab.engine.profile import measure, profile_document, warm_up
    from ctxlab.sim.steptime import ProfileStepTime

    choice = DEMO.config(session.cfg).profile
    if choice != "measure":
        path = Path(choice)
        return path, ProfileStepTime(path).label  # a bad file is one sentence
    design = profile_design(session)
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
    path = session.out / "step-profile.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    f = res.figures
    return path, (
        f"a profile of {f.say('profile_steps', len(measured))} engine steps shaped like these "
        f"requests, measured on this machine just before ({f.say('profile_s', t.wall_s, 1)} s)"
    )


def run_engine(
    session: Session, jobs: list[Job], pool: int, setup: Callable[[LLMEngine], None] | None = None
) -> dict:
    """Every job added at once, stepped to the end; the pool's and requests' own counts.
    `setup` is handed the engine first (demonstration 8 attaches its offload tier there)."""
    from ctxlab.engine import SamplingParams

    ev, e = DEMO.config(session.cfg), session.cfg.engine
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
    tokens = [engine.output(r).token_ids for r in rids]
    outs = [engine.output(r).metrics for r in rids]
    after = engine.stats()
    start = min(m.arrival_time for m in outs)
    return {
        "reused": sum(m.reused_tokens for m in outs),
        "queried": sum(m.prompt_tokens for m in outs),
        "hit_requests": sum(1 for m in outs if m.reused_tokens > 0),
        "evictions": after.cached_blocks_evicted - before.cached_blocks_evicted,
        "preemptions": sum(m.preemptions for m in outs),
        "ttft_ms": [m.ttft * 1e3 for m in outs],
        "makespan_s": max(m.finish_time for m in outs) - start,
        "peak_running": peak,
        "cpu_s": t.cpu_s,
        "tokens": tokens,
    }


def run_simulator(
    session: Session, jobs: list[Job], pool: int, profile: Path, **options: Any
) -> dict:
    """The same request list through `ctxlab.sim` with the engine's own settings (plus
    `options` for `SimConfig`: demonstration 8's offload tier)."""
    from ctxlab.plan.devices import custom_device
    from ctxlab.sim.config import SimConfig
    from ctxlab.sim.run import simulate
    from ctxlab.sim.steptime import ArchCost
    from ctxlab.sim.trace import Request, Trace

    ev, e = DEMO.config(session.cfg), session.cfg.engine
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
        **options,
    )
    res = simulate(trace, arch, custom_device(1.0, 1.0, pool_bytes), cfg)
    m = res.metrics
    seqs = sorted(res.seqs, key=lambda s: s.req.index)
    return {
        "reused": int(m["reused_tokens"]),
        "queried": int(m["queried_tokens"]),
        "hit_requests": int(m["hit_requests"]),
        "evictions": int(m["evictions"]),
        "preemptions": int(m["preemptions"]),
        "ttft_ms": [(s.first_token - s.arrival) * 1e3 for s in seqs],
        "makespan_s": float(m["makespan_s"]),
        "peak_running": int(m["peak_running_requests"]),
        "cpu_s": None,
        "transfer_bytes": int(m.get("offload_transfer_bytes", 0) or 0),
        "restored": int(m.get("reused_from_tier_tokens", 0) or 0),
    }


def run(session: Session, tracker: Tracker) -> DemoResult:
    ev = DEMO.config(session.cfg)
    res = DemoResult.of(DEMO, "run", "measured and modeled")
    session.llm(pool_tokens=256)  # warms the model up outside the measured pools
    profile, profile_label = step_profile(session, res)
    tracker.advance()
    pool = eviction_pool_tokens(session.cfg)
    jobs = build_jobs(session)
    unique = ev.groups * ev.prefix_tokens + len(jobs) * ev.suffix_tokens
    runs: dict[str, dict[str, dict]] = {}
    for order in ORDERS:
        listed = ordered(jobs, order)
        runs[order] = {"engine": run_engine(session, listed, pool)}
        tracker.advance()
        try:
            runs[order]["simulator"] = run_simulator(session, listed, pool, profile)
        except CtxlabError as exc:
            raise CtxlabError(f"demonstration 4's simulation failed: {exc}") from None
        tracker.advance()
        for side in runs[order].values():
            side["computed"] = side["queried"] - side["reused"]
            side["recomputed"] = side["computed"] - unique
            for q in (50, 95, 99):
                side[f"ttft_p{q}"] = pct(side["ttft_ms"], q)
    _tables(session, res, runs, pool, profile_label)
    g, i = runs["grouped"]["engine"], runs["interleaved"]["engine"]
    for name, key in (
        ("reused_tokens", "reused"),
        ("recomputed_tokens", "recomputed"),
        ("evictions", "evictions"),
    ):
        res.observe(name, g[key], i[key])
    for q in (50, 95, 99):
        c = latency_stats.compare(g["ttft_ms"], i["ttft_ms"], q, "up")
        res.observe(
            f"ttft_p{q}_ms", g[f"ttft_p{q}"], i[f"ttft_p{q}"], 1, change=c.change, test=c.test
        )
    si = runs["interleaved"]["simulator"]
    res.observe("sim_vs_engine_reused_tokens", i["reused"], si["reused"])
    res.observe("sim_vs_engine_evictions", i["evictions"], si["evictions"])
    c = latency_stats.compare(i["ttft_ms"], si["ttft_ms"], 50, "unchanged", paired=True)
    res.observe(
        "sim_vs_engine_ttft_p50_ms", i["ttft_p50"], si["ttft_p50"], 1, change=c.change, test=c.test
    )
    _explain(session, res, runs, pool, unique)
    from ctxlab.workshop.plots import plot_eviction

    ttft = {o: {s: runs[o][s]["ttft_ms"] for s in ("engine", "simulator")} for o in ORDERS}
    res.plots.append(plot_eviction(ttft, session.out / "plots" / "4_eviction.png"))
    return res


def _tables(session: Session, res: DemoResult, runs: dict, pool: int, profile_label: str) -> None:
    ev = DEMO.config(session.cfg)
    storage = Table(
        "eviction_storage",
        "storage",
        f"Demonstration 4: prefix cache with a pool of {pool:,} tokens for {ev.groups} prefixes "
        f"of {ev.prefix_tokens:,} tokens",
        "measured",
        [
            Column("arrivals"),
            Column("side"),
            Column("reused tokens"),
            Column("computed prompt tokens"),
            Column("recomputed tokens"),
            Column("hit requests"),
            Column("evicted blocks"),
            Column("preemptions"),
            Column("requests"),
        ],
        note="engine rows are measured, simulator rows modeled on the same request list; "
        "recomputed = computed prompt tokens minus tokens no earlier request had computed; "
        "exact counts over the requests column",
    )
    serving = Table(
        "eviction_serving",
        "serving",
        f"Demonstration 4: TTFT when all {len(runs['grouped']['engine']['ttft_ms'])} requests "
        f"arrive together, at most {ev.concurrency} running",
        "measured",
        [
            Column("arrivals"),
            Column("side"),
            Column("requests"),
            Column("TTFT p50 ms", 1),
            Column("p50 95 % low", 1),
            Column("p50 95 % high", 1),
            Column("TTFT p95 ms", 1),
            Column("TTFT p99 ms", 1),
            Column("p99 95 % low", 1),
            Column("p99 95 % high", 1),
            Column("makespan s", 2),
            Column("peak running"),
        ],
        note=f"simulator step times: {profile_label}; 95 % intervals: bootstrap of the "
        "percentile over the side's requests (ctxlab.stats); a p99 of a few requests is their "
        "largest, so its interval is wide or reaches the maximum",
    )
    compare = Table(
        "eviction_compare",
        "serving",
        "Demonstration 4: TTFT changes and their verdicts",
        "measured and modeled",
        [
            Column("figure"),
            Column("baseline"),
            Column("observed"),
            Column("baseline ms", 1),
            Column("observed ms", 1),
            Column("change ms", 1),
            Column("change 95 % low", 1),
            Column("change 95 % high", 1),
            Column("predicted"),
            Column("verdict"),
            Column("test"),
        ],
        note="predicted: the run's prediction for the figure (or the demonstration's "
        "hypothesis, no tolerance, where the config predicts nothing); verdict by "
        "ctxlab.stats.verdict: held when the whole 95 % interval of the change lies past the "
        "tolerance on the predicted side, failed when wholly on the other, otherwise within "
        "noise",
    )
    rate = session.cfg.cost.cpu_hourly
    cost = Table(
        "eviction_cost",
        "cost",
        "Demonstration 4: self-hosted cost of the whole request list (engine)",
        "measured",
        [
            Column("arrivals"),
            Column("computed prompt tokens"),
            Column("CPU seconds", 2),
            Column(f"{session.cfg.cost.currency} per 1,000 requests", 4),
        ],
        note="the run's measured CPU seconds at the configured hourly rate, over its requests",
    )
    storage.mode = serving.mode = "measured and modeled"
    for order in ORDERS:
        for side, r in runs[order].items():
            storage.add(
                order,
                side,
                r["reused"],
                r["computed"],
                r["recomputed"],
                r["hit_requests"],
                r["evictions"],
                r["preemptions"],
                len(r["ttft_ms"]),
            )
            _, p50_low, p50_high = latency_stats.cells(r["ttft_ms"], 50)
            _, p99_low, p99_high = latency_stats.cells(r["ttft_ms"], 99)
            serving.add(
                order,
                side,
                len(r["ttft_ms"]),
                r["ttft_p50"],
                p50_low,
                p50_high,
                r["ttft_p95"],
                r["ttft_p99"],
                p99_low,
                p99_high,
                r["makespan_s"],
                r["peak_running"],
            )
        e = runs[order]["engine"]
        n = len(e["ttft_ms"])
        e["cost_per_1000"] = e["cpu_s"] * rate / 3600 / n * 1000
        cost.add(order, e["computed"], e["cpu_s"], e["cost_per_1000"])
    g, i = runs["grouped"]["engine"], runs["interleaved"]["engine"]
    si = runs["interleaved"]["simulator"]
    predictions = session.cfg.predictions.get("eviction", {})
    cases = [
        (f"ttft_p{q}_ms", q, "grouped (engine)", g, "interleaved (engine)", i, "up", False)
        for q in (50, 99)
    ]
    cases.append(
        (
            "sim_vs_engine_ttft_p50_ms",
            50,
            "interleaved (engine)",
            i,
            "interleaved (simulator)",
            si,
            "unchanged",
            True,
        )
    )
    for metric, q, base_name, base, seen_name, seen, hypothesis, paired in cases:
        direction, tol = latency_stats.predicted(predictions, metric, hypothesis)
        before, after = base[f"ttft_p{q}"], seen[f"ttft_p{q}"]
        c = latency_stats.compare(
            base["ttft_ms"], seen["ttft_ms"], q, direction, paired, tol * abs(before)
        )
        said = direction + (f" (tolerance {100 * tol:g}%)" if tol else "")
        compare.add(
            f"TTFT p{q}",
            base_name,
            seen_name,
            before,
            after,
            *c.cells()[:3],
            said,
            c.verdict,
            c.test,
        )
    res.tables += [storage, serving, compare, cost]


def _explain(session: Session, res: DemoResult, runs: dict, pool: int, unique: int) -> None:
    f = res.figures
    ev = DEMO.config(session.cfg)
    g, i = runs["grouped"]["engine"], runs["interleaved"]["engine"]
    sg, si = runs["grouped"]["simulator"], runs["interleaved"]["simulator"]
    working = ev.groups * ev.prefix_tokens
    res.summary = (
        f"{f.say('requests', len(g['ttft_ms']))} requests in {f.say('groups', ev.groups)} prefix "
        f"groups; the pool ({f.say('pool_tokens', pool)} tokens) holds "
        f"{f.say('pool_share_pct', 100 * pool / working, 1)}% of the groups' "
        f"{f.say('working_set_tokens', working)} prefix tokens."
    )
    res.gains.append(
        Gain(
            "grouped arrivals against interleaved ones",
            f"grouped, the engine reused {f.say('reused_grouped', g['reused'])} prompt tokens and "
            f"evicted {f.say('evictions_grouped', g['evictions'])} cached blocks; interleaved, it "
            f"reused {f.say('reused_interleaved', i['reused'])} and evicted "
            f"{f.say('evictions_interleaved', i['evictions'])}: least-recently-used eviction "
            "dropped each prefix before its group came back, so "
            f"{f.say('recomputed_interleaved', i['recomputed'])} tokens that an earlier request "
            "had computed were computed again (grouped: "
            f"{f.say('recomputed_grouped', g['recomputed'])})",
            f"p99 TTFT {f.say('ttft_p99_grouped', g['ttft_p99'], 1)} ms grouped against "
            f"{f.say('ttft_p99_interleaved', i['ttft_p99'], 1)} ms interleaved (p50 "
            f"{f.say('ttft_p50_grouped', g['ttft_p50'], 1)} against "
            f"{f.say('ttft_p50_interleaved', i['ttft_p50'], 1)} ms); the whole list took "
            f"{f.say('makespan_grouped', g['makespan_s'], 2)} s against "
            f"{f.say('makespan_interleaved', i['makespan_s'], 2)} s",
        )
    )
    res.gains.append(
        Gain(
            "predicting it without running it (simulator)",
            "on the same list the simulator predicted "
            f"{f.say('sim_reused_interleaved', si['reused'])} "
            f"reused tokens and {f.say('sim_evictions_interleaved', si['evictions'])} evictions "
            f"interleaved, {f.say('sim_reused_grouped', sg['reused'])} and "
            f"{f.say('sim_evictions_grouped', sg['evictions'])} grouped",
            f"it predicted p50 TTFT {f.say('sim_ttft_p50_interleaved', si['ttft_p50'], 1)} ms "
            f"interleaved against {i['ttft_p50']:,.1f} ms measured, and "
            f"{f.say('sim_ttft_p50_grouped', sg['ttft_p50'], 1)} ms grouped against "
            f"{g['ttft_p50']:,.1f} ms",
        )
    )
    if sg["reused"] != g["reused"]:
        res.notes.append(
            f"In grouped order the simulator reused {f.say('sim_reused_grouped', sg['reused'])} "
            f"tokens and the engine {f.say('reused_grouped', g['reused'])}. Both count a "
            "prefix block as a hit only once it is computed, so the gap comes from admission "
            "order or step timing, not from the sharing rule."
        )
    if g["preemptions"] or i["preemptions"]:
        res.notes.append(
            "Some requests were preempted; the recomputed column counts prompt tokens at "
            "first admission only, not the work redone after a preemption."
        )
    res.notes.append(
        "LRU is recency, not meaning: the cache keeps what was used last, and knows nothing "
        "about which prefix will come back; that is why the arrival order alone moves reuse."
    )


# -- declarations ---------------------------------------------------------------------------


class EvictionSection(Section):
    groups: Annotated[int, Field(ge=2)]
    requests_per_group: Annotated[int, Field(ge=2)]
    prefix_tokens: Pos
    suffix_tokens: Pos
    output_tokens: Pos
    pool_share: Annotated[float, Field(gt=0, lt=1)]
    concurrency: Pos
    profile: str = Field(min_length=1)


_GROUPED, _INTERLEAVED = "grouped arrivals (engine)", "interleaved arrivals (engine)"
METRICS = (
    Metric("reused_tokens", "tokens", _GROUPED, _INTERLEAVED, "prompt tokens served by the cache"),
    Metric(
        "recomputed_tokens",
        "tokens",
        _GROUPED,
        _INTERLEAVED,
        "prompt tokens computed although an earlier request had computed them",
    ),
    Metric("evictions", "blocks", _GROUPED, _INTERLEAVED, "cached blocks evicted to make room"),
    Metric("ttft_p50_ms", "ms", _GROUPED, _INTERLEAVED, "median time to first token"),
    Metric("ttft_p95_ms", "ms", _GROUPED, _INTERLEAVED, "95th percentile time to first token"),
    Metric("ttft_p99_ms", "ms", _GROUPED, _INTERLEAVED, "99th percentile time to first token"),
    Metric(
        "sim_vs_engine_reused_tokens",
        "tokens",
        "engine, interleaved",
        "simulator, interleaved",
        "the simulator's reuse prediction on the same request list",
    ),
    Metric(
        "sim_vs_engine_evictions",
        "blocks",
        "engine, interleaved",
        "simulator, interleaved",
        "the simulator's eviction prediction",
    ),
    Metric(
        "sim_vs_engine_ttft_p50_ms",
        "ms",
        "engine, interleaved",
        "simulator, interleaved",
        "the simulator's median TTFT prediction",
    ),
)

TOML = """\
# -- 4: forced eviction with interleaved prefixes -------------------------------------------
[eviction]
groups = 4                    # prefix groups (e.g. four tenants' system prompts)
requests_per_group = 4
prefix_tokens = 384           # a whole number of pages of [engine] page_size
suffix_tokens = 40
output_tokens = 4
pool_share = 0.6              # the pool holds this share of the groups' prefixes (< 1: eviction)
concurrency = 2               # requests running at once (all arrive together, served in order)
profile = "measure"           # simulator step times: "measure" (steps shaped like these requests,
                              # measured here first) or a ctxlab-step-profile/1 file
"""

PREDICTIONS_TOML = """\
[predictions.eviction]        # baseline: grouped arrivals; observed: interleaved
reused_tokens = { direction = "down" }
recomputed_tokens = { direction = "up" }
evictions = { direction = "up" }
ttft_p50_ms = { direction = "up" }
ttft_p99_ms = { direction = "up" }
sim_vs_engine_reused_tokens = { direction = "unchanged", tolerance = 0.1 }
sim_vs_engine_evictions = { direction = "unchanged", tolerance = 0.25 }
sim_vs_engine_ttft_p50_ms = { direction = "unchanged", tolerance = 0.5 }
"""

QUICK_TOML = """\
[quick.eviction]
groups = 4
requests_per_group = 3
prefix_tokens = 128
pool_share = 0.7
suffix_tokens = 24
output_tokens = 2
"""


def eviction_pool_tokens(cfg: CommonConfig) -> int:
    """This demonstration's pool: `pool_share` of the groups' prefixes, in whole pages."""
    ev, page = DEMO.config(cfg), cfg.engine.page_size
    tokens = ev.pool_share * ev.groups * ev.prefix_tokens
    return max(page, -(-int(tokens) // page) * page)


def check(ev: EvictionSection, cfg: CommonConfig) -> None:
    """Whole pages of prefix, a pool that holds the running requests, requests that fit."""
    page = cfg.engine.page_size
    if ev.prefix_tokens % page:
        raise ValueError(
            f"eviction.prefix_tokens {ev.prefix_tokens} is not a whole number of "
            f"engine.page_size {page} pages"
        )
    request = ev.prefix_tokens + ev.suffix_tokens + ev.output_tokens
    slots = -(-request // page) * page
    pool = eviction_pool_tokens(cfg)
    if pool < ev.concurrency * slots:
        raise ValueError(
            f"eviction.pool_share {ev.pool_share} gives a pool of {pool} tokens, less than "
            f"{ev.concurrency} running requests of {slots} tokens; raise pool_share or "
            "lower concurrency"
        )
    fits(cfg, "eviction", request)


def _guard_lru(f: FigureValues) -> tuple[str, str]:
    return "guarded", (
        f"the prefix cache is reported as an LRU cache of exact token blocks: in demonstration "
        f"{DEMO.number} the arrival order alone moved reuse from {fmt(f['reused_grouped'])} to "
        f"{fmt(f['reused_interleaved'])} tokens, which no memory of meaning would do"
    )


DEMO = Demonstration(
    number=4,
    key="eviction",
    title="Forced eviction with interleaved prefixes",
    section=EvictionSection,
    metrics=METRICS,
    layers=("storage", "serving", "cost"),
    steps=steps,
    run=run,
    toml=TOML,
    predictions_toml=PREDICTIONS_TOML,
    quick_toml=QUICK_TOML,
    guards=((Risk.LRU_AS_MEMORY, _guard_lru),),
    check=check,
    required=("reused_tokens", "ttft_p99_ms", "sim_vs_engine_reused_tokens"),
)
