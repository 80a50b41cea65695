"""Demonstration 7: fixed recurrent state against a KV-heavy cache at equal memory.

Modeled: a hybrid with fixed recurrent state on most layers (e.g. Jamba) and a pure KV-cache
model (e.g. Llama 3.1 8B) get the same KV pool in bytes; the planner gives each one's bytes
per request, and the simulator (roofline step time on the named device) runs a workload of
many short requests and one of few long ones on both: how many requests run at once and the
p99 TTFT. Memory, not a request cap, is what limits them: max_running is the workload size.
Weights are not placed (a 52B hybrid needs more than one 80 GB device): the comparison is of
the KV pool alone, and says so.

Measured: the real engine has no recurrent layers. Its KV-heavy side (the default model
keeps K and V for every token) gets a fixed pool; many short requests and a few long ones go
through it, and the pool's own counts give the concurrency reached and the bytes each
request held. Beside it, the long workload runs on a windowed model (gemma3-270m: 15 of 18
layers keep a 512-token window, whose pages the engine hands back) and on the all-global
one (smollm2-135m) with pools of equal bytes: the measured half of "state that stops
growing"; the recurrent side stays modeled.

Measured TTFT percentiles carry the requests they come from and a 95 % bootstrap interval;
the engine's long against short workload is compared by a bootstrap of the difference
(`latency_stats`) with its verdict. Modeled figures (plan, simulator) have no sampling
noise: their comparisons are exact, held or failed.

The file is in three parts: `measure` returns frozen records (`Records`: `Modeled` rows, the
engine's `EngineRun`s, the `WindowedRun`s), `verdicts` records the observations and judges
the compare table's figures (the one place it judges), and the tables, prose and plot are
rendered from the records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import field_validator, model_validator

from ctxlab import stats
from ctxlab.progress import Tracker
from ctxlab.workshop import latency_stats
from ctxlab.workshop.config import (
    CommonConfig,
    Pos,
    PosFloat,
    Section,
    SimWorkload,
    Workload,
    arch_from,
    fits,
)
from ctxlab.workshop.demonstration import (
    Demonstration,
    FigureValues,
    Metric,
    Plot,
    Risk,
    ServerMode,
)
from ctxlab.workshop.measure import median, pct
from ctxlab.workshop.result import Column, DemoResult, Gain, Table, fmt
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from ctxlab.workshop.server_findings import ServerRun


GIB = 2**30
Role = Literal["KV-heavy", "recurrent"]
Size = Literal["short", "long"]
Pairing = Literal["all-global", "windowed"]
# The measured windowed pair: (role, registry name), the all-global model first (its pool of
# engine_pool_tokens tokens sets the bytes both get).
WINDOWED_PAIR: tuple[tuple[Pairing, str], ...] = (
    ("all-global", "smollm2-135m"),
    ("windowed", "gemma3-270m"),
)


# What one engine run of the long workload measured, in the order both tables print it.
ENGINE_RUN_COLUMNS = (
    Column("requests"),
    Column("tokens per request"),
    Column("concurrency reached"),
    Column("MiB per request (pool)", 3),
    Column("TTFT p50 ms", 1),
    Column("p50 95 % low", 1),
    Column("p50 95 % high", 1),
    Column("TTFT p99 ms", 1),
    Column("p99 95 % low", 1),
    Column("p99 95 % high", 1),
    Column("preemptions"),
)


def ttft_cells(ttft_ms: tuple[float, ...]) -> tuple[float, ...]:
    """TTFT p50 and p99 of one engine run, each with its 95 % bootstrap interval, in the
    order of ENGINE_RUN_COLUMNS."""
    return (*latency_stats.cells(ttft_ms, 50), *latency_stats.cells(ttft_ms, 99))


@dataclass(frozen=True)
class Modeled:
    """One architecture and workload at equal memory: the plan's bytes, the simulator's run."""

    role: Role
    workload: Size
    requests: int
    bytes_per_request: int  # the plan's, per request
    concurrency: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    makespan_s: float
    preemptions: int


@dataclass(frozen=True)
class EngineRun:
    """One workload on one real engine: the pool's counts and every request's TTFT."""

    concurrency: int  # most requests running at once
    bytes_per_request: int  # median of the bytes each request held at its end
    ttft_ms: tuple[float, ...]
    preemptions: int
    pool_bytes: int

    @property
    def ttft_p50_ms(self) -> float:
        return pct(self.ttft_ms, 50)

    @property
    def ttft_p99_ms(self) -> float:
        return pct(self.ttft_ms, 99)


@dataclass(frozen=True)
class WindowedRun:
    """The long engine workload on one model of `WINDOWED_PAIR`."""

    role: Pairing
    layers: int
    window: int | None  # the sliding layers' window (None: every layer is global)
    sliding: int  # layers that keep a window
    run: EngineRun


@dataclass(frozen=True)
class Records:
    """What demonstration 7 measured and modeled; every table, verdict and sentence reads
    these."""

    modeled: tuple[Modeled, ...]  # KV-heavy short and long, then recurrent short and long
    engine_short: EngineRun
    engine_long: EngineRun
    windowed: tuple[WindowedRun, ...]  # in the order of WINDOWED_PAIR

    def pick(self, role: Role, workload: Size) -> Modeled:
        return next(m for m in self.modeled if m.role == role and m.workload == workload)


@dataclass(frozen=True)
class Judged:
    """One figure of the compare table and its verdict against the run's prediction."""

    metric: str
    direction: str
    tolerance: float
    base: float
    seen: float
    compared: latency_stats.Compared


def steps(session: Session) -> int:
    return 4 + 2 + len(WINDOWED_PAIR)


def simulate_workload(
    arch, device, pool_bytes: int, w: SimWorkload, role: Role, workload: Size, per_request: int
) -> Modeled:
    """`w`'s requests arrive evenly at its rate (or at once), nothing shared; memory alone
    limits how many run."""
    from ctxlab.sim.config import SimConfig
    from ctxlab.sim.run import simulate
    from ctxlab.sim.trace import Request, Trace

    block = 512
    reqs, fresh = [], 0
    for i in range(w.requests):
        n = -(-w.input_tokens // block)
        at = i / w.rate if w.rate else 0.0
        reqs.append(Request(i, at, w.input_tokens, w.output_tokens, tuple(range(fresh, fresh + n))))
        fresh += n
    cfg = SimConfig(pool_bytes=pool_bytes, max_running=w.requests)
    m = simulate(Trace("workshop equal memory", reqs, block), arch, device, cfg).metrics
    return Modeled(
        role=role,
        workload=workload,
        requests=w.requests,
        bytes_per_request=per_request,
        concurrency=int(m["peak_running_requests"]),
        ttft_p50_ms=m["ttft_p50"] * 1e3,
        ttft_p99_ms=m["ttft_p99"] * 1e3,
        makespan_s=m["makespan_s"],
        preemptions=int(m["preemptions"]),
    )


def engine_workload(session: Session, w: Workload) -> EngineRun:
    """`w` on the real engine with the demonstration's pool: concurrency and bytes measured."""
    from ctxlab.engine import SamplingParams

    cfg = DEMO.config(session.cfg)
    llm = session.llm(
        pool_tokens=cfg.engine_pool_tokens,
        max_num_seqs=w.requests,
        warm_up=False,
        max_num_batched_tokens=max(session.cfg.engine.max_num_batched_tokens, w.input_tokens),
    )
    engine = llm.engine
    params = SamplingParams(max_tokens=w.output_tokens, ignore_eos=True)
    rids = [engine.add_request(session.text_ids(w.input_tokens), params) for _ in range(w.requests)]
    peak = 0
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, len(engine.scheduler.running))
    outs = [engine.output(r).metrics for r in rids]
    session.note_resident(
        "demonstration 7", max(m.resident_kv_bytes for m in outs), session.slot_bytes(llm)
    )
    return _engine_run(engine, peak, outs)


def _engine_run(engine, peak: int, outs: list) -> EngineRun:
    """The pool's counts and the requests' own metrics, once every request finished."""
    return EngineRun(
        concurrency=peak,
        bytes_per_request=int(median([m.resident_kv_bytes for m in outs])),
        ttft_ms=tuple(m.ttft * 1e3 for m in outs),
        preemptions=sum(m.preemptions for m in outs),
        pool_bytes=engine.stats().pool_bytes,
    )


def windowed_workload(session: Session, w: Workload, tracker: Tracker) -> list[WindowedRun]:
    """`w` on the all-global and on the windowed model of `WINDOWED_PAIR`, each engine given
    a pool of the same bytes (the all-global model's pool of `engine_pool_tokens` tokens, at
    the run's dtype): requests running at once, bytes each held at its end, TTFT. The run's
    own model is reused when it is one of them; the other is loaded here."""
    from ctxlab.engine import LLM, SamplingParams
    from ctxlab.eval.vocab import essay_text
    from ctxlab.model import load_model

    cfg, e = DEMO.config(session.cfg), session.cfg.engine
    width = 4 if session.cfg.model.dtype == "float32" else 2
    rows: list[WindowedRun] = []
    pool_bytes = 0
    for role, name in WINDOWED_PAIR:
        own = session.cfg.model.source == name
        loaded = session.loaded if own else load_model(name, dtype=session.cfg.model.dtype)
        c = loaded.config
        per_token = c.num_layers * c.num_kv_heads * 2 * c.head_dim * width
        pool_bytes = pool_bytes or cfg.engine_pool_tokens * per_token
        tokens = pool_bytes // per_token // e.page_size * e.page_size
        llm = LLM(
            loaded,
            kv_pool_tokens=tokens,
            block_size=e.page_size,
            max_num_seqs=w.requests,
            max_num_batched_tokens=max(e.max_num_batched_tokens, w.input_tokens),
            dtype=session.cfg.model.dtype,
        )
        if own:
            prompts = [session.text_ids(w.input_tokens) for _ in range(w.requests)]
        else:
            ids = loaded.tokenizer.encode(essay_text()[: 8 * w.input_tokens * (w.requests + 1)])
            prompts = [
                ids[i * w.input_tokens : (i + 1) * w.input_tokens] for i in range(w.requests)
            ]
        engine = llm.engine
        params = SamplingParams(max_tokens=w.output_tokens, ignore_eos=True)
        rids = [engine.add_request(p, params) for p in prompts]
        peak = 0
        while engine.has_unfinished():
            engine.step()
            peak = max(peak, len(engine.scheduler.running))
        outs = [engine.output(r).metrics for r in rids]
        windows = [x for x in getattr(c, "sliding_windows", ()) if x]
        rows.append(
            WindowedRun(
                role,
                c.num_layers,
                windows[0] if windows else None,
                len(windows),
                _engine_run(engine, peak, outs),
            )
        )
        tracker.advance()
    return rows


def measure(session: Session, tracker: Tracker) -> Records:
    """Both architectures modeled on both workloads, the engine's two workloads, and the
    windowed pair (nothing formatted)."""
    from ctxlab.plan.devices import get_device
    from ctxlab.plan.report import build_plan

    cfg = DEMO.config(session.cfg)
    device = get_device(cfg.device)
    pool_bytes = int(cfg.pool_gib * GIB)
    modeled: list[Modeled] = []
    roles: tuple[tuple[Role, str], ...] = (
        ("KV-heavy", cfg.kv_arch),
        ("recurrent", cfg.recurrent_arch),
    )
    for role, name in roles:
        arch = arch_from(name)
        contexts = [
            cfg.short.input_tokens + cfg.short.output_tokens,
            cfg.long.input_tokens + cfg.long.output_tokens,
        ]
        # Only the plan's per-request bytes are read; the weights are not placed (see above).
        plan = build_plan(
            arch, contexts, device=device, page_size=16, weights_bytes=0, reserve_bytes=0
        )
        sizes: tuple[tuple[Size, SimWorkload, int], ...] = (
            ("short", cfg.short, 0),
            ("long", cfg.long, 1),
        )
        for label, w, row in sizes:
            per_request = plan["per_context"][row]["kv_bytes_per_request"]
            modeled.append(simulate_workload(arch, device, pool_bytes, w, role, label, per_request))
            tracker.advance()
    session.llm(pool_tokens=256)  # warms the model up outside the measured pool
    short = engine_workload(session, cfg.engine_short)
    long = engine_workload(session, cfg.engine_long)
    tracker.advance(2)
    windowed = windowed_workload(session, cfg.engine_long, tracker)
    return Records(tuple(modeled), short, long, tuple(windowed))


def verdicts(session: Session, r: Records, res: DemoResult) -> list[Judged]:
    """The metrics the run's predictions are judged on (`res.observe`), and the compare
    table's figures judged against the config's prediction (or this demonstration's
    hypothesis where the config predicts none): the one place this demonstration judges.
    Modeled figures are exact; the engine's TTFT is a bootstrap over its requests."""
    kv_short, rec_short = r.pick("KV-heavy", "short"), r.pick("recurrent", "short")
    res.observe("bytes_per_request", kv_short.bytes_per_request, rec_short.bytes_per_request)
    res.observe("concurrency_reached", kv_short.concurrency, rec_short.concurrency)
    res.observe(
        "ttft_p99_ms",
        kv_short.ttft_p99_ms,
        rec_short.ttft_p99_ms,
        1,
        change=stats.exact(rec_short.ttft_p99_ms - kv_short.ttft_p99_ms),
        test="simulated: no sampling noise, a zero-wide interval",
    )
    s, lg = r.engine_short, r.engine_long
    res.observe("engine_concurrency_reached", lg.concurrency, s.concurrency)
    res.observe("engine_bytes_per_request", lg.bytes_per_request, s.bytes_per_request)
    moved = latency_stats.compare(lg.ttft_ms, s.ttft_ms, 99, "down")
    res.observe(
        "engine_ttft_p99_ms",
        lg.ttft_p99_ms,
        s.ttft_p99_ms,
        1,
        change=moved.change,
        test=moved.test,
    )
    predictions = session.cfg.predictions.get(DEMO.key, {})
    out = []
    for metric, hypothesis in (
        ("bytes_per_request", "down"),
        ("concurrency_reached", "up"),
        ("ttft_p99_ms", "down"),
    ):
        direction, tol = latency_stats.predicted(predictions, metric, hypothesis)
        field = "concurrency" if metric == "concurrency_reached" else metric
        base, seen = float(getattr(kv_short, field)), float(getattr(rec_short, field))
        change = stats.exact(seen - base)
        kind = stats.verdict(change, direction, tol * abs(base))
        compared = latency_stats.Compared(change, kind, "modeled: exact, no sampling noise")
        out.append(Judged(metric, direction, tol, base, seen, compared))
    direction, tol = latency_stats.predicted(predictions, "engine_ttft_p99_ms", "down")
    c = latency_stats.compare(lg.ttft_ms, s.ttft_ms, 99, direction, tolerance=tol * lg.ttft_p99_ms)
    out.append(Judged("engine_ttft_p99_ms", direction, tol, lg.ttft_p99_ms, s.ttft_p99_ms, c))
    return out


def run(session: Session, tracker: Tracker) -> DemoResult:
    """Measure, judge, then render tables, prose and the plot from the records."""
    records = measure(session, tracker)
    res = DemoResult.of(DEMO, "run", "measured and modeled")
    judged = verdicts(session, records, res)
    _tables(session, res, records, judged)
    _windowed_table(session, res, records.windowed)
    _explain(session, res, records)
    cfg = DEMO.config(session.cfg)
    res.plots.append(
        draw(
            [f"{_arch(cfg, m.role)}\n{m.workload}" for m in records.modeled],
            [m.concurrency for m in records.modeled],
            [m.ttft_p99_ms for m in records.modeled],
            DEMO.plot("7_recurrent_vs_kv.png").path(session.out),
        )
    )
    return res


def _arch(cfg: RecurrentSection, role: Role) -> str:
    """The configured architecture of a role."""
    return cfg.kv_arch if role == "KV-heavy" else cfg.recurrent_arch


def _tables(session: Session, res: DemoResult, r: Records, judged: list[Judged]) -> None:
    cfg = DEMO.config(session.cfg)
    storage = Table(
        "recurrent_storage",
        "storage",
        f"Demonstration 7: cache bytes per request (plan, the presets' cache dtype), pool "
        f"{cfg.pool_gib:,.1f} GiB for both",
        "modeled",
        [
            Column("architecture"),
            Column("role"),
            Column("workload"),
            Column("tokens per request"),
            Column("MiB per request", 2),
            Column("requests that fit the pool"),
        ],
        note="fit = pool bytes // bytes per request (logical, before paging); recurrent "
        "state is fixed per request, attention layers still grow with every token",
    )
    serving = Table(
        "recurrent_serving",
        "serving",
        f"Demonstration 7: equal memory on {cfg.device} (simulated, roofline step time)",
        "modeled",
        [
            Column("architecture"),
            Column("workload"),
            Column("requests"),
            Column("concurrency reached"),
            Column("TTFT p50 ms", 1),
            Column("TTFT p99 ms", 1),
            Column("makespan s", 2),
            Column("preemptions"),
        ],
        note=f"arrivals evenly spaced: short {cfg.short.rate:,.1f} and long {cfg.long.rate:,.1f} "
        "per second; nothing is shared; max running = the workload's size, so memory is the "
        "limit; simulated from a roofline, so no sampling noise: percentiles over the requests "
        "column, without intervals",
    )
    engine = Table(
        "recurrent_engine",
        "serving",
        f"Demonstration 7: the KV-heavy side on the real engine, pool of "
        f"{cfg.engine_pool_tokens:,} tokens",
        "measured",
        [
            Column("workload"),
            *ENGINE_RUN_COLUMNS,
        ],
        note="bytes per request: blocks the request held at its end, measured from the pool; "
        "TTFT 95 % intervals: bootstrap of the percentile over the workload's requests "
        "(ctxlab.stats); a p99 of a few requests is their largest",
    )
    pool_bytes = int(cfg.pool_gib * GIB)
    for m in r.modeled:
        w = cfg.short if m.workload == "short" else cfg.long
        tokens = w.input_tokens + w.output_tokens
        arch = _arch(cfg, m.role)
        storage.add(
            arch,
            m.role,
            m.workload,
            tokens,
            m.bytes_per_request / 2**20,
            pool_bytes // m.bytes_per_request,
        )
        serving.add(
            arch,
            m.workload,
            m.requests,
            m.concurrency,
            m.ttft_p50_ms,
            m.ttft_p99_ms,
            m.makespan_s,
            m.preemptions,
        )
    for label, w, e in (
        ("short", cfg.engine_short, r.engine_short),
        ("long", cfg.engine_long, r.engine_long),
    ):
        engine.add(
            label,
            w.requests,
            w.input_tokens + w.output_tokens,
            e.concurrency,
            e.bytes_per_request / 2**20,
            *ttft_cells(e.ttft_ms),
            e.preemptions,
        )
    res.tables += [storage, serving, engine, _compare_table(session, r, judged)]


def _compare_table(session: Session, r: Records, judged: list[Judged]) -> Table:
    """The compared figures with their change, interval and verdict (judged in `verdicts`):
    modeled ones exact (no sampling noise), the engine's TTFT by a bootstrap over its
    requests."""
    cfg = DEMO.config(session.cfg)
    table = Table(
        "recurrent_compare",
        "serving",
        "Demonstration 7: compared figures, their changes and verdicts",
        "measured and modeled",
        [
            Column("metric"),
            Column("baseline"),
            Column("observed"),
            Column("n (baseline, observed)"),
            Column("baseline value", 1),
            Column("observed value", 1),
            Column("change", 1),
            Column("change 95 % low", 1),
            Column("change 95 % high", 1),
            Column("predicted"),
            Column("verdict"),
            Column("test"),
        ],
        note="predicted: the run's prediction (or the demonstration's hypothesis, no "
        "tolerance, where the config predicts nothing); verdict by ctxlab.stats.verdict; "
        "modeled figures are exact (a zero-wide interval: held or failed, never within noise)",
    )
    kv, rec = r.pick("KV-heavy", "short"), r.pick("recurrent", "short")
    s, lg = r.engine_short, r.engine_long
    names = {
        "engine_ttft_p99_ms": (
            "long (engine)",
            "short (engine)",
            f"{len(lg.ttft_ms)}, {len(s.ttft_ms)}",
        )
    }
    modeled = (
        f"{_arch(cfg, kv.role)} (short)",
        f"{_arch(cfg, rec.role)} (short)",
        f"{kv.requests}, {rec.requests}",
    )
    for j in judged:
        c = j.compared
        table.add(
            j.metric,
            *names.get(j.metric, modeled),
            j.base,
            j.seen,
            c.change.value,
            c.change.low,
            c.change.high,
            j.direction + (f" (tolerance {100 * j.tolerance:g}%)" if j.tolerance else ""),
            c.verdict,
            c.test,
        )
    return table


def _windowed_table(session: Session, res: DemoResult, rows: tuple[WindowedRun, ...]) -> None:
    w = DEMO.config(session.cfg).engine_long
    table = Table(
        "recurrent_windowed",
        "serving",
        f"Demonstration 7: a windowed model against an all-global one on the real engine, "
        f"pools of {res.figures.say('windowed_pool_mib', rows[0].run.pool_bytes / 2**20, 2)} MiB "
        "each",
        "measured",
        [
            Column("model"),
            Column("layers"),
            *ENGINE_RUN_COLUMNS,
        ],
        note="the long engine workload on each model; equal pool bytes (the all-global "
        "model's engine_pool_tokens); a sliding layer hands back the pages behind its window, "
        "so past the window its bytes stop growing; TTFT also reflects each model's size",
    )
    models = dict(WINDOWED_PAIR)
    for r in rows:
        layers = (
            f"{r.sliding} sliding (W = {r.window}) + {r.layers - r.sliding} global"
            if r.sliding
            else f"{r.layers} global"
        )
        table.add(
            models[r.role],
            layers,
            w.requests,
            w.input_tokens + w.output_tokens,
            r.run.concurrency,
            r.run.bytes_per_request / 2**20,
            *ttft_cells(r.run.ttft_ms),
            r.run.preemptions,
        )
    res.tables.append(table)


def _explain(session: Session, res: DemoResult, r: Records) -> None:
    f = res.figures
    cfg = DEMO.config(session.cfg)
    ks, rs = r.pick("KV-heavy", "short"), r.pick("recurrent", "short")
    kl, rl = r.pick("KV-heavy", "long"), r.pick("recurrent", "long")
    s, lg = r.engine_short, r.engine_long
    res.summary = (
        f"{cfg.recurrent_arch} and {cfg.kv_arch} with the same "
        f"{f.say('pool_gib', cfg.pool_gib, 1)} GiB KV pool (modeled), and the default model's "
        f"pool of {f.say('engine_pool_tokens', cfg.engine_pool_tokens)} tokens on the engine "
        "(measured)."
    )
    res.gains.append(
        Gain(
            "fixed recurrent state at equal memory (modeled)",
            "a short request holds "
            f"{f.say('kv_short_mib', ks.bytes_per_request / 2**20, 2)} MiB "
            f"on {cfg.kv_arch} and "
            f"{f.say('rec_short_mib', rs.bytes_per_request / 2**20, 2)} MiB "
            f"on {cfg.recurrent_arch}, whose recurrent layers keep a fixed state instead of every "
            "token's keys and values",
            f"in the same pool {f.say('kv_short_conc', ks.concurrency)} short requests ran at "
            f"once on {cfg.kv_arch} and {f.say('rec_short_conc', rs.concurrency)} on "
            f"{cfg.recurrent_arch}; p99 TTFT {f.say('kv_short_p99', ks.ttft_p99_ms, 1)} ms "
            f"(p50 {f.say('kv_short_p50', ks.ttft_p50_ms, 1)} ms, "
            f"{f.say('kv_short_preemptions', ks.preemptions)} preemptions: requests waited "
            f"for room in the pool) against {f.say('rec_short_p99', rs.ttft_p99_ms, 1)} ms; "
            "with long requests "
            f"{f.say('kv_long_conc', kl.concurrency)} against "
            f"{f.say('rec_long_conc', rl.concurrency)} at once",
        )
    )
    res.gains.append(
        Gain(
            "short requests against long ones on the KV-heavy engine (measured)",
            f"a short request held {f.say('engine_short_mib', s.bytes_per_request / 2**20, 3)} "
            "MiB of the pool, a long one "
            f"{f.say('engine_long_mib', lg.bytes_per_request / 2**20, 3)} "
            "MiB: on a KV-heavy model bytes grow with every token",
            f"{f.say('engine_short_conc', s.concurrency)} short requests ran at once against "
            f"{f.say('engine_long_conc', lg.concurrency)} long ones; p99 TTFT "
            f"{f.say('engine_short_p99', s.ttft_p99_ms, 1)} ms against "
            f"{f.say('engine_long_p99', lg.ttft_p99_ms, 1)} ms",
        )
    )
    res.gains.append(
        Gain(
            "what the recurrent state keeps (no decision established)",
            "a fixed-size state is a lossy summary of the history, not a cache of it: storage "
            "per request is smaller, and no token can be read back exactly",
            None,
        )
    )
    res.notes.append(
        "This run measures no task quality for either architecture: smaller state per "
        "request is a storage and capacity result, not evidence that the recurrent model "
        "answers as well over long context."
    )


def draw(labels: list[str], concurrency: list[int], p99_ms: list[float], path: Path) -> Path:
    """Concurrency reached and p99 TTFT per architecture and workload (modeled)."""
    from ctxlab.workshop.plots import figure, save

    fig, (left, right) = figure()
    xs = range(len(labels))
    left.bar(xs, concurrency, color="tab:blue")
    left.set_ylabel("requests running at once")
    right.bar(xs, [t / 1e3 for t in p99_ms], color="tab:orange")
    right.set_ylabel("p99 TTFT (s)")
    for ax in (left, right):
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    left.set_title("equal memory: concurrency")
    right.set_title("equal memory: p99 TTFT")
    return save(fig, path)


# -- declarations ---------------------------------------------------------------------------


class RecurrentSection(Section):
    recurrent_arch: str
    kv_arch: str
    device: str
    pool_gib: PosFloat
    short: SimWorkload
    long: SimWorkload
    engine_pool_tokens: Pos
    engine_short: Workload
    engine_long: Workload

    @field_validator("recurrent_arch", "kv_arch")
    @classmethod
    def _arch(cls, name: str) -> str:
        arch_from(name)  # an unknown preset or an unreadable file is one sentence
        return name

    @field_validator("device")
    @classmethod
    def _device(cls, name: str) -> str:
        from ctxlab.plan.devices import DEVICES

        if name not in DEVICES:
            raise ValueError(f"{name!r} is not a device (known: {', '.join(DEVICES)})")
        return name

    @model_validator(mode="after")
    def _kinds(self) -> RecurrentSection:
        rec, kv = arch_from(self.recurrent_arch), arch_from(self.kv_arch)
        if rec.fixed_state_bytes() == 0:
            raise ValueError(f"recurrent_arch {self.recurrent_arch!r} has no recurrent layer")
        if kv.fixed_state_bytes() != 0 or kv.kv_bytes_per_token() == 0:
            raise ValueError(f"kv_arch {self.kv_arch!r} is not a pure KV-cache architecture")
        for name, w in (("engine_short", self.engine_short), ("engine_long", self.engine_long)):
            if w.input_tokens + w.output_tokens > self.engine_pool_tokens:
                raise ValueError(
                    f"one {name} request ({w.input_tokens} + {w.output_tokens} tokens) does not "
                    f"fit engine_pool_tokens {self.engine_pool_tokens}"
                )
        return self


_KV, _REC = "KV-heavy architecture", "fixed-recurrent-state architecture"
METRICS = (
    Metric("bytes_per_request", "bytes", _KV, _REC, "cache bytes of one short request (plan)"),
    Metric(
        "concurrency_reached",
        "requests",
        _KV,
        _REC,
        "most requests running at once, short workload at equal memory (simulated)",
    ),
    Metric("ttft_p99_ms", "ms", _KV, _REC, "p99 TTFT, short workload at equal memory (simulated)"),
    Metric(
        "engine_concurrency_reached",
        "requests",
        "long requests (engine)",
        "short requests (engine)",
        "most requests running at once on the real engine's pool",
    ),
    Metric(
        "engine_bytes_per_request",
        "bytes",
        "long requests (engine)",
        "short requests (engine)",
        "resident cache bytes per request, measured from the pool",
    ),
    Metric(
        "engine_ttft_p99_ms",
        "ms",
        "long requests (engine)",
        "short requests (engine)",
        "p99 TTFT on the real engine",
    ),
)

TOML = """\
# -- 7: fixed recurrent state against a KV-heavy cache at equal memory ----------------------
[recurrent_vs_kv]
recurrent_arch = "jamba-v0.1" # with recurrent layers (modeled: plan + simulate); a preset,
                              # a .gguf file (header only) or a Hugging Face config.json
kv_arch = "llama-3.1-8b"      # a cache that grows with every token; the same three sources
device = "h100"               # the device the simulator prices steps on (roofline)
pool_gib = 16.0               # equal memory: the same KV pool for both, in GiB
# many short requests and a few long ones, arriving evenly at `rate` per second (0: at once)
short = { requests = 256, input_tokens = 2048, output_tokens = 512, rate = 8.0 }
long = { requests = 16, input_tokens = 32768, output_tokens = 256, rate = 0.5 }
engine_pool_tokens = 2560     # the real engine's pool for its KV-heavy contrast
engine_short = { requests = 16, input_tokens = 128, output_tokens = 8 }
engine_long = { requests = 4, input_tokens = 1024, output_tokens = 8 }
"""

PREDICTIONS_TOML = """\
[predictions.recurrent_vs_kv] # baseline: KV-heavy; observed: recurrent (engine: long vs short)
bytes_per_request = { direction = "down" }
concurrency_reached = { direction = "up" }
ttft_p99_ms = { direction = "down" }
engine_concurrency_reached = { direction = "up" }
engine_bytes_per_request = { direction = "down" }
"""

QUICK_TOML = """\
[quick.recurrent_vs_kv]
engine_pool_tokens = 1024
engine_short = { requests = 8, input_tokens = 64, output_tokens = 4 }
engine_long = { requests = 2, input_tokens = 384, output_tokens = 4 }
"""


def check(r: RecurrentSection, cfg: CommonConfig) -> None:
    w = r.engine_long
    fits(cfg, "recurrent_vs_kv.engine_long", w.input_tokens + w.output_tokens)


def _guard_lossless(f: FigureValues) -> tuple[str, str]:
    return "guarded", (
        f"demonstration {DEMO.number} calls the recurrent state a fixed, lossy summary and "
        "claims only capacity and latency for it; it says that no quality decision is "
        "established"
    )


def _guard_p99(f: FigureValues) -> tuple[str, str]:
    return "guarded", (
        f"in demonstration {DEMO.number} the KV-heavy model's short workload has p50 TTFT "
        f"{fmt(f['kv_short_p50'], 1)} ms and p99 {fmt(f['kv_short_p99'], 1)} ms, with "
        f"{fmt(f['kv_short_preemptions'])} preemptions behind the tail"
    )


def _on_server(session: Session, run: ServerRun, res: DemoResult) -> None:
    """Through a server: the measured short and long workloads sent to it as well."""
    from ctxlab.workshop.server_demos import workload_rows

    c = DEMO.config(session.cfg)
    workload_rows(session, run, res, [("short", c.engine_short), ("long", c.engine_long)])


DEMO = Demonstration(
    number=7,
    key="recurrent_vs_kv",
    title="Fixed recurrent state against a KV-heavy cache at equal memory",
    section=RecurrentSection,
    metrics=METRICS,
    layers=("storage", "serving"),
    steps=steps,
    run=run,
    toml=TOML,
    predictions_toml=PREDICTIONS_TOML,
    quick_toml=QUICK_TOML,
    guards=((Risk.RECURRENT_LOSSLESS, _guard_lossless), (Risk.P99, _guard_p99)),
    check=check,
    required=("concurrency_reached", "engine_concurrency_reached"),
    plots=(
        Plot(
            "7_recurrent_vs_kv.png",
            "concurrency reached and p99 TTFT per architecture and workload",
        ),
    ),
    server=ServerMode(extra=_on_server),
)
