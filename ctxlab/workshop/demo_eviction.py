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

The file is in three parts: `measure` returns frozen records (the workload itself lives in
`eviction_workload.py`, shared with demonstration 8 and this demonstration's server
variant), `verdicts` records the observations and judges the compare table's TTFT
comparisons (the one place it judges), and the tables, prose and plot are rendered from the
records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ctxlab.errors import CtxlabError
from ctxlab.progress import Tracker
from ctxlab.workshop import eviction_workload as workload
from ctxlab.workshop import latency_stats
from ctxlab.workshop.config import CommonConfig, fits
from ctxlab.workshop.demonstration import (
    Demonstration,
    FigureValues,
    Metric,
    Plot,
    Risk,
    ServerMode,
)
from ctxlab.workshop.eviction_workload import EvictionSection, SideRun, StepProfile
from ctxlab.workshop.result import Column, DemoResult, Gain, Table, fmt
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from ctxlab.workshop.server_findings import ServerRun


ORDERS = workload.ORDERS


def steps(session: Session) -> int:
    return 1 + 2 * len(ORDERS)


@dataclass(frozen=True)
class OrderRuns:
    """One arrival order: the engine measured, the simulator on the same list."""

    engine: SideRun
    simulator: SideRun


@dataclass(frozen=True)
class Records:
    """What demonstration 4 measured; every table, verdict and sentence reads these."""

    pool: int
    unique: int  # prompt tokens no earlier request had computed
    working: int  # the groups' prefix tokens
    profile: StepProfile
    grouped: OrderRuns
    interleaved: OrderRuns

    def order(self, name: str) -> OrderRuns:
        return self.grouped if name == "grouped" else self.interleaved


@dataclass(frozen=True)
class TtftCase:
    """One TTFT comparison of the compare table and the prediction it is judged against."""

    q: int
    base_name: str
    base: SideRun
    seen_name: str
    seen: SideRun
    direction: str
    tolerance: float
    compared: latency_stats.Compared


def measure(session: Session, tracker: Tracker) -> Records:
    """Both orders on the engine and the simulator (counts and times, nothing formatted)."""
    ev, page = DEMO.config(session.cfg), session.cfg.engine.page_size
    session.llm(pool_tokens=256)  # warms the model up outside the measured pools
    profile = workload.step_profile(session, ev)
    tracker.advance()
    pool = workload.pool_tokens(ev, page)
    jobs = workload.build_jobs(session, ev, page)
    runs: dict[str, OrderRuns] = {}
    for order in ORDERS:
        listed = workload.ordered(jobs, order)
        engine = workload.run_engine(session, ev, listed, pool)
        tracker.advance()
        try:
            sim = workload.run_simulator(
                session, ev, listed, pool, workload.profile_path(session, ev)
            )
        except CtxlabError as exc:
            raise CtxlabError(f"demonstration 4's simulation failed: {exc}") from None
        tracker.advance()
        runs[order] = OrderRuns(engine, sim)
    unique = workload.unique_tokens(ev, jobs)
    working = ev.groups * ev.prefix_tokens
    return Records(pool, unique, working, profile, runs["grouped"], runs["interleaved"])


def verdicts(session: Session, r: Records, res: DemoResult) -> list[TtftCase]:
    """The metrics the run's predictions are judged on (`res.observe`), and the TTFT
    comparisons of the compare table judged against the config's prediction (or this
    demonstration's hypothesis where the config predicts none): the one place this
    demonstration judges."""
    g, i = r.grouped.engine, r.interleaved.engine
    si = r.interleaved.simulator
    u = r.unique
    res.observe("reused_tokens", g.reused, i.reused)
    res.observe("recomputed_tokens", g.recomputed(u), i.recomputed(u))
    res.observe("evictions", g.evictions, i.evictions)
    for q in (50, 95, 99):
        c = latency_stats.compare(list(g.ttft_ms), list(i.ttft_ms), q, "up")
        res.observe(f"ttft_p{q}_ms", g.ttft_p(q), i.ttft_p(q), 1, change=c.change, test=c.test)
    res.observe("sim_vs_engine_reused_tokens", i.reused, si.reused)
    res.observe("sim_vs_engine_evictions", i.evictions, si.evictions)
    c = latency_stats.compare(list(i.ttft_ms), list(si.ttft_ms), 50, "unchanged", paired=True)
    res.observe(
        "sim_vs_engine_ttft_p50_ms", i.ttft_p(50), si.ttft_p(50), 1, change=c.change, test=c.test
    )
    predictions = session.cfg.predictions.get(DEMO.key, {})
    cases = [
        (f"ttft_p{q}_ms", q, "grouped (engine)", g, "interleaved (engine)", i, "up", False)
        for q in (50, 99)
    ]
    cases.append(
        ("sim_vs_engine_ttft_p50_ms", 50, "interleaved (engine)", i,
         "interleaved (simulator)", si, "unchanged", True)
    )  # fmt: skip
    out = []
    for metric, q, base_name, base, seen_name, seen, hypothesis, paired in cases:
        direction, tol = latency_stats.predicted(predictions, metric, hypothesis)
        c = latency_stats.compare(
            list(base.ttft_ms), list(seen.ttft_ms), q, direction, paired, tol * abs(base.ttft_p(q))
        )
        out.append(TtftCase(q, base_name, base, seen_name, seen, direction, tol, c))
    return out


def run(session: Session, tracker: Tracker) -> DemoResult:
    """Measure, judge, then render tables, prose and the plot from the records."""
    records = measure(session, tracker)
    res = DemoResult.of(DEMO, "run", "measured and modeled")
    cases = verdicts(session, records, res)
    _tables(session, res, records, cases)
    _explain(session, res, records)
    ttft = {
        o: {"engine": list(records.order(o).engine.ttft_ms),
            "simulator": list(records.order(o).simulator.ttft_ms)}
        for o in ORDERS
    }  # fmt: skip
    res.plots.append(draw(ttft, DEMO.plot("4_eviction.png").path(session.out)))
    return res


def _tables(session: Session, res: DemoResult, r: Records, cases: list[TtftCase]) -> None:
    ev, pool = DEMO.config(session.cfg), r.pool
    profile_label = workload.profile_label(res.figures, r.profile)
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
        f"Demonstration 4: TTFT when all {len(r.grouped.engine.ttft_ms)} requests "
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
        runs = r.order(order)
        for side, run in (("engine", runs.engine), ("simulator", runs.simulator)):
            ttft = list(run.ttft_ms)
            storage.add(
                order,
                side,
                run.reused,
                run.computed,
                run.recomputed(r.unique),
                run.hit_requests,
                run.evictions,
                run.preemptions,
                len(ttft),
            )
            _, p50_low, p50_high = latency_stats.cells(ttft, 50)
            _, p99_low, p99_high = latency_stats.cells(ttft, 99)
            serving.add(
                order,
                side,
                len(ttft),
                run.ttft_p(50),
                p50_low,
                p50_high,
                run.ttft_p(95),
                run.ttft_p(99),
                p99_low,
                p99_high,
                run.makespan_s,
                run.peak_running,
            )
        e = runs.engine
        cpu_s = e.cpu_s or 0.0
        cost.add(order, e.computed, cpu_s, cpu_s * rate / 3600 / len(e.ttft_ms) * 1000)
    for case in cases:
        said = case.direction + (
            f" (tolerance {100 * case.tolerance:g}%)" if case.tolerance else ""
        )
        c = case.compared
        compare.add(
            f"TTFT p{case.q}",
            case.base_name,
            case.seen_name,
            case.base.ttft_p(case.q),
            case.seen.ttft_p(case.q),
            *c.cells()[:3],
            said,
            c.verdict,
            c.test,
        )
    res.tables += [storage, serving, compare, cost]


def _explain(session: Session, res: DemoResult, r: Records) -> None:
    f = res.figures
    ev, pool, working, u = DEMO.config(session.cfg), r.pool, r.working, r.unique
    g, i = r.grouped.engine, r.interleaved.engine
    sg, si = r.grouped.simulator, r.interleaved.simulator
    res.summary = (
        f"{f.say('requests', len(g.ttft_ms))} requests in {f.say('groups', ev.groups)} prefix "
        f"groups; the pool ({f.say('pool_tokens', pool)} tokens) holds "
        f"{f.say('pool_share_pct', 100 * pool / working, 1)}% of the groups' "
        f"{f.say('working_set_tokens', working)} prefix tokens."
    )
    res.gains.append(
        Gain(
            "grouped arrivals against interleaved ones",
            f"grouped, the engine reused {f.say('reused_grouped', g.reused)} prompt tokens and "
            f"evicted {f.say('evictions_grouped', g.evictions)} cached blocks; interleaved, it "
            f"reused {f.say('reused_interleaved', i.reused)} and evicted "
            f"{f.say('evictions_interleaved', i.evictions)}: least-recently-used eviction "
            "dropped each prefix before its group came back, so "
            f"{f.say('recomputed_interleaved', i.recomputed(u))} tokens that an earlier request "
            "had computed were computed again (grouped: "
            f"{f.say('recomputed_grouped', g.recomputed(u))})",
            f"p99 TTFT {f.say('ttft_p99_grouped', g.ttft_p(99), 1)} ms grouped against "
            f"{f.say('ttft_p99_interleaved', i.ttft_p(99), 1)} ms interleaved (p50 "
            f"{f.say('ttft_p50_grouped', g.ttft_p(50), 1)} against "
            f"{f.say('ttft_p50_interleaved', i.ttft_p(50), 1)} ms); the whole list took "
            f"{f.say('makespan_grouped', g.makespan_s, 2)} s against "
            f"{f.say('makespan_interleaved', i.makespan_s, 2)} s",
        )
    )
    res.gains.append(
        Gain(
            "predicting it without running it (simulator)",
            "on the same list the simulator predicted "
            f"{f.say('sim_reused_interleaved', si.reused)} "
            f"reused tokens and {f.say('sim_evictions_interleaved', si.evictions)} evictions "
            f"interleaved, {f.say('sim_reused_grouped', sg.reused)} and "
            f"{f.say('sim_evictions_grouped', sg.evictions)} grouped",
            f"it predicted p50 TTFT {f.say('sim_ttft_p50_interleaved', si.ttft_p(50), 1)} ms "
            f"interleaved against {i.ttft_p(50):,.1f} ms measured, and "
            f"{f.say('sim_ttft_p50_grouped', sg.ttft_p(50), 1)} ms grouped against "
            f"{g.ttft_p(50):,.1f} ms",
        )
    )
    if sg.reused != g.reused:
        res.notes.append(
            f"In grouped order the simulator reused {f.say('sim_reused_grouped', sg.reused)} "
            f"tokens and the engine {f.say('reused_grouped', g.reused)}. Both count a "
            "prefix block as a hit once computed or for a request admitted for the step "
            "that computes it, so the gap comes from admission order or step timing, not "
            "from the sharing rule."
        )
    if g.preemptions or i.preemptions:
        res.notes.append(
            "Some requests were preempted; the recomputed column counts prompt tokens at "
            "first admission only, not the work redone after a preemption."
        )
    res.notes.append(
        "LRU is recency, not meaning: the cache keeps what was used last, and knows nothing "
        "about which prefix will come back; that is why the arrival order alone moves reuse."
    )


def draw(ttft: dict[str, dict[str, list[float]]], path: Path) -> Path:
    """TTFT distribution per arrival order: engine (measured) against simulator (modeled)."""
    from ctxlab.workshop.plots import figure, save

    fig, axes = figure()
    for ax, order in zip(axes, ("grouped", "interleaved"), strict=True):
        for side, style in (("engine", "-"), ("simulator", "--")):
            ys = sorted(ttft[order][side])
            n = len(ys)
            ax.step(ys, [(i + 1) / n for i in range(n)], style, where="post", label=side)
        ax.set_title(f"{order} arrivals")
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)


# -- declarations ---------------------------------------------------------------------------


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
    return workload.pool_tokens(DEMO.config(cfg), cfg.engine.page_size)


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


def preflight(ev: EvictionSection) -> None:
    """A step profile the config names is read before the model loads."""
    if ev.profile != "measure":
        from ctxlab.sim.steptime import ProfileStepTime

        ProfileStepTime(Path(ev.profile))


def _on_server(session: Session, run: ServerRun) -> DemoResult:
    """Through a server: sized to its probed cache instead of a pool."""
    from ctxlab.workshop import server_eviction

    return server_eviction.run(session, run, DEMO)


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
    plots=(
        Plot("4_eviction.png", "the TTFT distribution per arrival order, engine against simulator"),
    ),
    preflight=preflight,
    server=ServerMode(needs_cached_tokens=True, variant=_on_server),
)
