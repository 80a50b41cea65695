"""Demonstration 9: prefill and decode in two processes (disaggregation), measured.

The same workload runs twice on this machine: a few decode streams start at once and, while
they decode, long prompts arrive. First on one colocated engine (this process, the run's
threads); then disaggregated: a `ctxlab serve --role prefill` process (started at the
beginning, so it loads while the colocated run goes) computes the prompts' KV on one core
and one torch thread, and this process decodes on the other core and one thread, the KV
arriving page by page over a Unix socket (`ctxlab.serve.disagg_decode`). Measured: the
second process's resident memory (a second copy of the weights), KV bytes and seconds moved
per request, TTFT and TPOT, and the inter-token gaps of the streams while a long prompt is
being prefilled (the interference disaggregation removes). The simulator's
`--disaggregated` mode predicts the same requests from a step profile measured here on one
thread and the measured transfer bandwidth, side by side with the measurement.

Two processes on one machine's two cores show the mechanism and its costs, not a cluster:
the link is a local socket (no network), both sides share one memory bus and caches, and
each side has one core where a cluster gives each a whole accelerator.

The file is in three parts: `measure` returns frozen records (`Records`), `verdicts` records
the observations the predictions are judged on (the one place it judges), and the tables and
prose are rendered from the records.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, model_validator

from ctxlab.plan.self_hosted import Usage, self_hosted_bill
from ctxlab.progress import Tracker
from ctxlab.workshop.config import CommonConfig, Pos, Section, fits
from ctxlab.workshop.demonstration import Demonstration, FigureValues, Metric, Risk
from ctxlab.workshop.measure import Timer, pct
from ctxlab.workshop.result import Column, DemoResult, Gain, Table, fmt
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from ctxlab.engine import LLMEngine, RequestOutput
    from ctxlab.serve.disagg_decode import DecodeEngine


MIB = 2**20
READY_S = 300.0


@dataclass
class Planned:
    kind: str  # "stream" or "long"
    at: float  # seconds from the start of the run
    ids: list[int]
    max_tokens: int


def steps(session: Session) -> int:
    return 5


def make_plan(session: Session) -> list[Planned]:
    cfg = DEMO.config(session.cfg)
    out = [
        Planned("stream", 0.0, session.text_ids(cfg.stream_tokens), cfg.stream_output)
        for _ in range(cfg.streams)
    ]
    for j in range(cfg.long_prompts):
        at = cfg.lead_s + j * cfg.gap_s
        out.append(Planned("long", at, session.text_ids(cfg.long_tokens), cfg.long_output))
    return out


def drive(engine: LLMEngine | DecodeEngine, plan: list[Planned]) -> list[RequestOutput]:
    """Add each request at its time while stepping; the requests' own metrics, in order."""
    from ctxlab.engine import SamplingParams

    order = sorted(range(len(plan)), key=lambda i: plan[i].at)
    rids: dict[int, int] = {}
    t0 = time.perf_counter()
    while order or engine.has_unfinished():
        now = time.perf_counter() - t0
        while order and plan[order[0]].at <= now:
            i = order.pop(0)
            p = plan[i]
            rid = engine.add_request(
                p.ids, SamplingParams(max_tokens=p.max_tokens, ignore_eos=True)
            )
            engine.seqs[rid].metrics.arrival_time = t0 + p.at
            rids[i] = rid
        if engine.has_unfinished():
            engine.step()
        elif order:
            time.sleep(min(0.005, max(0.0, plan[order[0]].at - now)))
    outs = [engine.output(rids[i]) for i in range(len(plan))]
    for rid in rids.values():
        engine.seqs.pop(rid, None)
    return outs


@dataclass(frozen=True)
class Served:
    """One setup's requests, in milliseconds: every TTFT and TPOT, and the streams' gaps that
    end while a long prompt waits for its first token."""

    ttft_ms: tuple[float, ...]
    tpot_ms: tuple[float, ...]
    itl_busy_ms: tuple[float, ...]
    long_ttft_ms: tuple[float, ...]


@dataclass(frozen=True)
class Simulated:
    """The simulator's disaggregated run of the same requests."""

    ttft_ms: tuple[float, ...]
    itl_p99_ms: float


@dataclass(frozen=True)
class Records:
    """What demonstration 9 measured; every table, verdict and sentence reads these."""

    colocated: Served
    disaggregated: Served
    simulated: Simulated
    child_rss: int  # the prefill process's resident bytes after the run
    child_hwm: int  # and its peak
    colo_cpu_s: float  # CPU seconds of the colocated run
    dis_cpu_s: float  # of the disaggregated run, both processes
    weights: int  # bytes of one copy of the weights
    kv_bytes: float  # per long prompt (median over them)
    kv_bytes_all: int  # every byte the decode side received
    kv_pages: float  # pages per long prompt (median)
    kv_ms: float  # transfer milliseconds per long prompt (median)
    kv_n: int  # long prompts whose transfer was recorded
    bandwidth: float  # bytes per second over the socket
    pinned: bool  # each side had a core of its own


def served(plan: list[Planned], outs: list[RequestOutput]) -> Served:
    """TTFT, TPOT, and the streams' gaps that end while a long prompt waits for its first
    token (being prefilled, and moved when disaggregated)."""
    failed = [o for o in outs if o.finish_reason == "error"]
    if failed:
        raise RuntimeError(f"a request failed: {failed[0].error}")
    busy = [
        (o.metrics.arrival_time, o.metrics.first_token_time)
        for p, o in zip(plan, outs, strict=True)
        if p.kind == "long"
    ]
    itl_busy: list[float] = []
    for p, o in zip(plan, outs, strict=True):
        if p.kind != "stream":
            continue
        times = o.metrics.token_times
        for a, b in itertools.pairwise(times):
            if any(lo <= b <= hi for lo, hi in busy):
                itl_busy.append((b - a) * 1e3)
    ttft = [o.metrics.ttft * 1e3 for o in outs]
    tpot = [o.metrics.tpot * 1e3 for o in outs if len(o.token_ids) > 1]
    long_ttft = [o.metrics.ttft * 1e3 for p, o in zip(plan, outs, strict=True) if p.kind == "long"]
    return Served(tuple(ttft), tuple(tpot), tuple(itl_busy), tuple(long_ttft))


def _start_prefill(session: Session, address: str, cpu: int | None, pool: int) -> subprocess.Popen:
    cfg, e = session.cfg, session.cfg.engine
    args = [sys.executable, "-c", "from ctxlab.cli import main; main()", "serve"]
    args += ["--role", "prefill", "--kv-socket", address, "--threads", "1"]
    args += ["--model", cfg.model.source, "--weights", "fp32"]  # float32, as run() checked
    args += ["--kv-pool-tokens", str(pool), "--page-size", str(e.page_size)]
    args += ["--max-num-batched-tokens", str(e.max_num_batched_tokens)]
    if cpu is not None:
        args += ["--prefill-cpu", str(cpu)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("CTXLAB_DISAGG_FAULT", None)
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )


def _wait_ready(child: subprocess.Popen) -> None:
    line: list[str] = []
    reader = threading.Thread(
        target=lambda: line.append(child.stdout.readline() if child.stdout else ""), daemon=True
    )
    reader.start()
    reader.join(READY_S)
    if not line or not line[0].startswith("ready kv"):
        child.kill()
        raise RuntimeError(f"the prefill process did not start (exit status {child.poll()})")


def _proc(pid: int) -> dict[str, float]:
    """Resident bytes (now and peak) and CPU seconds of a process, from /proc."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out["cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _profile(session: Session, engine: LLMEngine, out: Path) -> Path:
    """A step profile on this engine (one thread), shaped like the workload's steps."""
    import json

    from ctxlab.engine.profile import Design, measure, profile_document

    cfg = DEMO.config(session.cfg)
    design = Design(
        prefill=((cfg.long_tokens, 1), (cfg.stream_tokens, 2)),
        decode_contexts=(cfg.stream_tokens + cfg.stream_output // 2,),
        decode_batches=tuple(sorted({1, max(1, cfg.streams // 2), cfg.streams})),
        decode_steps=3,
        mixed_batch=(cfg.streams,),
        mixed_context=cfg.stream_tokens,
        mixed_prompts=(cfg.long_tokens,),
    )
    vocab = session.loaded.config.vocab_size
    measured = measure(engine, design, vocab, session.cfg.model.seed)
    doc = profile_document(
        measured, session.cfg.model.source, session.cfg.model.dtype, engine, "workshop disagg"
    )
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return out


def _simulate(session: Session, plan: list[Planned], profile: Path, bandwidth: float) -> Simulated:
    from ctxlab.plan.devices import custom_device
    from ctxlab.sim.config import SimConfig
    from ctxlab.sim.run import simulate
    from ctxlab.sim.steptime import ArchCost
    from ctxlab.sim.trace import Request, Trace

    cfg, e = DEMO.config(session.cfg), session.cfg.engine
    arch = session.arch()
    reqs, fresh = [], 0
    for i, p in enumerate(plan):
        n = -(-len(p.ids) // e.page_size)
        reqs.append(Request(i, p.at, len(p.ids), p.max_tokens, tuple(range(fresh, fresh + n))))
        fresh += n
    trace = Trace("workshop disaggregation", reqs, block_tokens=e.page_size)
    pool_bytes = cfg.pool_tokens * ArchCost.build(arch, arch.weight_bytes).kv_bytes_per_token
    sim_cfg = SimConfig(
        page_size=e.page_size,
        chunk_tokens=e.max_num_batched_tokens,
        max_running=len(plan),
        pool_bytes=pool_bytes,
        profile=str(profile),
        disaggregated=True,
        kv_transfer_bandwidth=bandwidth,
    )
    res = simulate(trace, arch, custom_device(1.0, 1.0, pool_bytes), sim_cfg)
    seqs = sorted(res.seqs, key=lambda s: s.req.index)
    return Simulated(
        tuple((s.first_token - s.arrival) * 1e3 for s in seqs),
        float(res.metrics["itl_p99"]) * 1e3,
    )


def unsupported(session: Session) -> str | None:
    """Why this model or dtype cannot be disaggregated here (None: it can)."""
    if any(getattr(session.loaded.config, "sliding_windows", ()) or ()):
        return (
            f"on {session.cfg.model.source}: disaggregated serving does not move "
            "sliding-window layers' caches yet"
        )
    if session.cfg.model.dtype != "float32":
        return (
            f"at model.dtype {session.cfg.model.dtype}: the prefill process (`ctxlab serve "
            "--role prefill`) keeps a float32 cache, and pages move only between equal layouts"
        )
    return None


def measure(session: Session, tracker: Tracker) -> Records:
    """The workload colocated, then split over two processes, then simulated (nothing
    formatted)."""
    import torch

    from ctxlab.engine import LLM
    from ctxlab.serve.disagg_channel import Channel, connect
    from ctxlab.serve.disagg_decode import DecodeEngine

    cfg, e = DEMO.config(session.cfg), session.cfg.engine
    cpus = sorted(os.sched_getaffinity(0))
    pin = len(cpus) >= 2
    folder = Path(tempfile.mkdtemp(prefix="ctxlab-disagg-"))
    address = str(folder / "kv.sock")
    child = _start_prefill(session, address, cpus[0] if pin else None, cfg.pool_tokens)
    try:
        plan = make_plan(session)
        colo_llm = session.llm(pool_tokens=cfg.pool_tokens, max_num_seqs=len(plan))
        with Timer() as tc:
            colo = served(plan, drive(colo_llm.engine, plan))
        del colo_llm
        tracker.advance()
        _wait_ready(child)
        tracker.advance()
        threads, affinity = torch.get_num_threads(), os.sched_getaffinity(0)
        try:
            torch.set_num_threads(1)
            llm = LLM(
                session.loaded,
                kv_pool_tokens=cfg.pool_tokens,
                block_size=e.page_size,
                max_num_batched_tokens=e.max_num_batched_tokens,
                max_num_seqs=len(plan),
                max_model_len=session.cfg.model.max_model_len,
            )
            # The step profile first, on the prefill process's core while it idles: the
            # prefill side's steps are most of TTFT, and the two runs are close in time.
            if pin:
                os.sched_setaffinity(0, {cpus[0]})
            profile = _profile(session, llm.engine, session.out / "disagg-step-profile.json")
            tracker.advance()
            if pin:
                os.sched_setaffinity(0, {cpus[1]})
            model_id = f"{session.cfg.model.source}@fp32"
            dec = DecodeEngine(llm.engine, Channel(connect(address)), model_id)
            warm = [Planned("long", 0.0, session.text_ids(3 * e.page_size), 2)]
            drive(dec, warm)  # first-call costs on both sides, not counted
            dec.records.clear()
            child0 = _proc(child.pid)
            with Timer() as td:
                dis = served(plan, drive(dec, plan))
            child1 = _proc(child.pid)
            transfers = list(dec.records)
            tracker.advance()
        finally:
            torch.set_num_threads(threads)
            os.sched_setaffinity(0, affinity)
    finally:
        child.terminate()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
    long_tr = [t for t in transfers if t["pages"] >= (cfg.long_tokens - 1) // e.page_size]
    moved_bytes = sum(t["bytes"] for t in long_tr)
    moved_s = sum(t["transfer_s"] for t in long_tr)
    bandwidth = moved_bytes / moved_s if moved_s > 0 else float("inf")
    sim = _simulate(session, plan, profile, bandwidth)
    tracker.advance()
    weights = sum(t.numel() * t.element_size() for t in session.loaded.model.parameters())
    return Records(
        colocated=colo,
        disaggregated=dis,
        simulated=sim,
        child_rss=int(child1["VmRSS"]),
        child_hwm=int(child1["VmHWM"]),
        colo_cpu_s=tc.cpu_s,
        dis_cpu_s=td.cpu_s + child1["cpu_s"] - child0["cpu_s"],
        weights=weights,
        kv_bytes=pct([t["bytes"] for t in long_tr], 50),
        kv_bytes_all=sum(t["bytes"] for t in transfers),  # as the decode side recorded
        kv_pages=pct([t["pages"] for t in long_tr], 50),
        kv_ms=pct([t["transfer_s"] * 1e3 for t in long_tr], 50),
        kv_n=len(long_tr),
        bandwidth=bandwidth,
        pinned=pin,
    )


def run(session: Session, tracker: Tracker) -> DemoResult:
    """Measure, judge, then render the tables and prose from the records (or say why this
    model cannot be disaggregated here)."""
    why = unsupported(session)
    if why is not None:
        res = DemoResult.of(DEMO, "not measurable")
        res.summary = f"Not measurable {why}."
        res.notes.append(res.summary)
        return res
    records = measure(session, tracker)
    res = DemoResult.of(DEMO, "run", "measured and modeled")
    verdicts(records, res)
    _tables(session, res, records)
    _explain(session, res, records)
    return res


def verdicts(r: Records, res: DemoResult) -> None:
    """The metrics the run's predictions are judged on (`res.observe`): the one place this
    demonstration judges (`ctxlab.workshop.verdicts` reads them against the config)."""
    c, d = r.colocated, r.disaggregated
    res.observe("resident_extra_mib", 0.0, r.child_rss / MIB, 1)
    res.observe("kv_bytes_per_request", 0, r.kv_bytes)
    res.observe("transfer_ms_per_request", 0.0, r.kv_ms, 2)
    res.observe("ttft_p50_ms", pct(c.ttft_ms, 50), pct(d.ttft_ms, 50), 1)
    res.observe("itl_p99_busy_ms", pct(c.itl_busy_ms, 99), pct(d.itl_busy_ms, 99), 1)
    res.observe("tpot_p50_ms", pct(c.tpot_ms, 50), pct(d.tpot_ms, 50), 2)
    res.observe("sim_vs_measured_ttft_p50_ms", pct(d.ttft_ms, 50), pct(r.simulated.ttft_ms, 50), 1)


def _tables(session: Session, res: DemoResult, r: Records) -> None:
    cfg, cost = DEMO.config(session.cfg), session.cfg.cost
    f = res.figures
    storage = Table(
        "disagg_storage",
        "storage",
        "Demonstration 9: what a second process holds and what crosses between them",
        "measured",
        [
            Column("setup"),
            Column("processes"),
            Column("weight copies"),
            Column("weights MiB (all copies)", 1),
            Column("extra resident MiB", 1),
            Column("KV MiB moved per long prompt", 2),
            Column("pages per long prompt"),
        ],
        note=f"resident: the prefill process's VmRSS after the run (peak "
        f"{f.say('child_hwm_mib', r.child_hwm / MIB, 1)} MiB): its weights, its own KV "
        f"pool of {cfg.pool_tokens:,} tokens and its runtime; pages moved: whole pages of the "
        "prompt minus its last token (the decode side computes the tail)",
    )
    w = r.weights / MIB
    storage.add("colocated", 1, 1, w, 0.0, 0.0, 0)
    storage.add("disaggregated", 2, 2, 2 * w, r.child_rss / MIB, r.kv_bytes / MIB, r.kv_pages)
    serving = Table(
        "disagg_serving",
        "serving",
        f"Demonstration 9: {cfg.streams} decode streams while {cfg.long_prompts} prompts of "
        f"{cfg.long_tokens:,} tokens arrive",
        "measured",
        [
            Column("setup"),
            Column("TTFT p50 ms", 1),
            Column("TTFT p99 ms", 1),
            Column("TPOT p50 ms", 2),
            Column("TPOT p99 ms", 2),
            Column("ITL p99 while prefilling ms", 1),
            Column("n (TTFT / ITL)"),
            Column("KV transfer ms per long prompt", 2),
        ],
        note=(
            "colocated: one engine on the run's threads; disaggregated: prefill and decode "
            "each on one thread "
            + ("and one core" if r.pinned else "(one core only here: not pinned)")
            + f"; KV over a Unix socket at "
            f"{f.say('bandwidth_gbs', r.bandwidth / 1e9, 2)} GB/s measured; simulated: "
            "`ctxlab.sim` --disaggregated from a 1-thread step profile measured here and that "
            "bandwidth; 2 cores shared with the rest of the run"
        ),
    )
    for name, side in (("colocated", r.colocated), ("disaggregated", r.disaggregated)):
        serving.add(
            name,
            pct(side.ttft_ms, 50),
            pct(side.ttft_ms, 99),
            pct(side.tpot_ms, 50),
            pct(side.tpot_ms, 99),
            pct(side.itl_busy_ms, 99),
            f"{len(side.ttft_ms)} / {len(side.itl_busy_ms)}",
            r.kv_ms if name == "disaggregated" else 0.0,
        )
    s = r.simulated.ttft_ms
    serving.add("disaggregated (simulated)", pct(s, 50), pct(s, 99), None, None,
                r.simulated.itl_p99_ms, f"{len(s)} / -", None)  # fmt: skip
    prices = cost.self_hosted_prices()
    cost_t = Table(
        "disagg_cost",
        "cost",
        "Demonstration 9: CPU seconds and memory of the same requests",
        "measured",
        [
            Column("setup"),
            Column("CPU s"),
            Column("KV MiB moved", 1),
            Column(f"{cost.currency} per 1,000 such runs", 4),
            Column("resident MiB beyond one process", 1),
        ],
        note=f"CPU seconds of every process during the run at {prices.cpu_hourly} "
        f"{cost.currency} per CPU hour and the KV bytes the decode process received (what "
        f"its kv_transfer_bytes counts) at {prices.network_per_gb} {cost.currency}/GB (0: "
        "they cross between two processes of one machine); memory is not priced here but is "
        "what a second instance costs first",
    )
    for name, cpu_s, moved, rss in (
        ("colocated", r.colo_cpu_s, 0, 0.0),
        ("disaggregated", r.dis_cpu_s, r.kv_bytes_all, r.child_rss / MIB),
    ):
        usage = Usage(device_seconds=0.0, succeeded=1, cpu_seconds=cpu_s, network_bytes=moved)
        run_cost = self_hosted_bill(usage, prices).total
        cost_t.add(name, round(cpu_s, 2), moved / MIB, run_cost * 1000, rss)
    res.tables += [storage, serving, cost_t]


def _explain(session: Session, res: DemoResult, r: Records) -> None:
    f = res.figures
    cfg = DEMO.config(session.cfg)
    c, d = r.colocated, r.disaggregated
    res.summary = (
        f"{f.say('streams', cfg.streams)} decode streams and "
        f"{f.say('long_prompts', cfg.long_prompts)} prompts of "
        f"{f.say('long_tokens', cfg.long_tokens)} tokens, on one engine and then on a prefill "
        "process and a decode process (one core each), the KV moved page by page."
    )
    res.gains.append(
        Gain(
            "prefill and decode in two processes (measured)",
            f"the second process holds {f.say('child_rss_mib', r.child_rss / MIB, 1)} MiB "
            f"resident, of which {f.say('weights_mib', r.weights / MIB, 1)} MiB is a second "
            f"copy of the weights; each long prompt moved "
            f"{f.say('kv_mib', r.kv_bytes / MIB, 2)} MiB of KV "
            f"({f.say('kv_pages', r.kv_pages)} pages) in "
            f"{f.say('kv_ms', r.kv_ms, 1)} ms",
            f"ITL p99 of the running streams while long prompts prefilled: "
            f"{f.say('colo_itl_p99', pct(c.itl_busy_ms, 99), 1)} ms colocated against "
            f"{f.say('dis_itl_p99', pct(d.itl_busy_ms, 99), 1)} ms disaggregated; TTFT p50 "
            f"{f.say('colo_ttft_p50', pct(c.ttft_ms, 50), 1)} against "
            f"{f.say('dis_ttft_p50', pct(d.ttft_ms, 50), 1)} ms (prefill on one core, "
            f"plus the transfer); CPU {f.say('colo_cpu_s', r.colo_cpu_s, 2)} s against "
            f"{f.say('dis_cpu_s', r.dis_cpu_s, 2)} s",
        )
    )
    sim50 = pct(r.simulated.ttft_ms, 50)
    meas50 = pct(d.ttft_ms, 50)
    res.gains.append(
        Gain(
            "the simulator's transfer terms against the measurement (modeled)",
            f"the simulator moved whole pages at the measured "
            f"{f.say('sim_bandwidth_gbs', r.bandwidth / 1e9, 2)} GB/s",
            f"it predicts TTFT p50 {f.say('sim_ttft_p50', sim50, 1)} ms against "
            f"{f.say('meas_ttft_p50', meas50, 1)} ms measured "
            f"({f.say('sim_ttft_err_pct', (sim50 / meas50 - 1) * 100 if meas50 else 0, 0)} %)",
        )
    )
    res.notes.append(
        "Two processes on one machine's two cores show what disaggregation costs and removes, "
        "not a cluster: the link is a local socket, both sides share one memory bus, and "
        "each has one core where a cluster gives each side whole accelerators."
    )


# -- declarations ---------------------------------------------------------------------------


class DisaggregationSection(Section):
    """Demonstration 9: decode streams while long prompts arrive, colocated and split."""

    streams: Pos
    stream_tokens: Pos
    stream_output: Annotated[int, Field(ge=2)]
    long_prompts: Pos
    long_tokens: Annotated[int, Field(ge=33)]  # at least two pages of 16 move
    long_output: Pos
    lead_s: Annotated[float, Field(ge=0)]
    gap_s: Annotated[float, Field(ge=0)]
    pool_tokens: Pos

    @model_validator(mode="after")
    def _fits(self) -> DisaggregationSection:
        need = self.streams * (self.stream_tokens + self.stream_output) + self.long_prompts * (
            self.long_tokens + self.long_output
        )
        if need > self.pool_tokens:
            raise ValueError(
                f"the workload needs {need} tokens at once, more than pool_tokens "
                f"{self.pool_tokens}"
            )
        return self


def check(d: DisaggregationSection, cfg: CommonConfig) -> None:
    fits(cfg, "disaggregation.long_tokens", d.long_tokens + d.long_output)


_COLO, _SPLIT = "colocated (one process)", "disaggregated (prefill and decode processes)"
METRICS = (
    Metric(
        "resident_extra_mib",
        "MiB",
        _COLO,
        _SPLIT,
        "resident memory of the second process (its copy of the weights, its pool, runtime)",
    ),
    Metric("kv_bytes_per_request", "bytes", _COLO, _SPLIT, "KV bytes moved per long prompt"),
    Metric(
        "transfer_ms_per_request",
        "ms",
        _COLO,
        _SPLIT,
        "milliseconds from a long prompt's first KV page to its last",
    ),
    Metric("ttft_p50_ms", "ms", _COLO, _SPLIT, "p50 TTFT over every request"),
    Metric(
        "itl_p99_busy_ms",
        "ms",
        _COLO,
        _SPLIT,
        "p99 gap between tokens of running decodes while a long prompt is prefilled",
    ),
    Metric("tpot_p50_ms", "ms", _COLO, _SPLIT, "p50 time per output token"),
    Metric(
        "sim_vs_measured_ttft_p50_ms",
        "ms",
        "measured (disaggregated)",
        "simulated (disaggregated)",
        "p50 TTFT the simulator predicts for the same requests from a measured profile",
    ),
)

TOML = """\
# -- 9: prefill and decode in two processes (disaggregation) --------------------------------
[disaggregation]              # decode streams start; long prompts arrive while they decode
streams = 3                   # decode streams (short prompts, many output tokens)
stream_tokens = 48
stream_output = 48
long_prompts = 2              # long prompts, each prefilled while the streams decode
long_tokens = 768
long_output = 4
lead_s = 0.3                  # seconds before the first long prompt
gap_s = 0.6                   # seconds between long prompts
pool_tokens = 4096            # each engine's KV pool (the prefill process holds its own)
"""

PREDICTIONS_TOML = """\
[predictions.disaggregation] # baseline: colocated; observed: disaggregated (two processes)
# a second process holds a second copy of the weights (513 MiB at float32) plus its own pool
resident_extra_mib = { direction = "up", range = [513, 4096] }
# whole pages of the prompt minus its last token: 47 pages x 16 tokens x 46,080 bytes
kv_bytes_per_request = { direction = "up", range = [34652160, 34652160] }
transfer_ms_per_request = { direction = "up" }
# the prompt is prefilled on one core instead of two, then moved
ttft_p50_ms = { direction = "up" }
# the running decodes no longer wait behind a long prompt's prefill step
itl_p99_busy_ms = { direction = "down" }
sim_vs_measured_ttft_p50_ms = { direction = "unchanged", tolerance = 0.25 }
"""

QUICK_TOML = """\
[quick.disaggregation]
streams = 2
stream_output = 24
long_prompts = 1
long_tokens = 384
pool_tokens = 2048

[quick.predictions.disaggregation]
resident_extra_mib = { direction = "up", range = [513, 4096] }
# 23 pages x 16 tokens x 46,080 bytes
kv_bytes_per_request = { direction = "up", range = [16957440, 16957440] }
transfer_ms_per_request = { direction = "up" }
ttft_p50_ms = { direction = "up" }
itl_p99_busy_ms = { direction = "down" }
sim_vs_measured_ttft_p50_ms = { direction = "unchanged", tolerance = 0.25 }
"""


def _guard_disaggregation(f: FigureValues) -> tuple[str, str]:
    return "guarded", (
        f"demonstration {DEMO.number} ran prefill and decode in two processes and counted "
        "both sides: the "
        f"second process held {fmt(f['child_rss_mib'], 1)} MiB resident ("
        f"{fmt(f['weights_mib'], 1)} MiB of it a second copy of the weights), each long prompt "
        f"moved {fmt(f['kv_mib'], 2)} MiB of KV in {fmt(f['kv_ms'], 1)} ms, and the running "
        f"decodes' ITL p99 while long prompts prefilled went from {fmt(f['colo_itl_p99'], 1)} ms "
        f"colocated to {fmt(f['dis_itl_p99'], 1)} ms, at TTFT p50 {fmt(f['colo_ttft_p50'], 1)} "
        f"against {fmt(f['dis_ttft_p50'], 1)} ms"
    )


DEMO = Demonstration(
    number=9,
    key="disaggregation",
    title="Prefill and decode in two processes",
    section=DisaggregationSection,
    metrics=METRICS,
    layers=("storage", "serving", "cost"),
    steps=steps,
    run=run,
    toml=TOML,
    predictions_toml=PREDICTIONS_TOML,
    quick_toml=QUICK_TOML,
    guards=((Risk.DISAGGREGATION, _guard_disaggregation),),
    check=check,
)
