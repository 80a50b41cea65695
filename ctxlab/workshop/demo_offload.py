"""Demonstration 8: a second tier for the prefix cache, on demonstration 4's workload.

Demonstration 4's interleaved arrivals (A B C D A B C D ..., the pool holding only a share of
the prefixes) make the LRU evict each prefix before its group comes back. Here the same kind
of request list runs twice on the real engine: without a tier (evicted blocks vanish and are
recomputed) and with the prefix cache's offload tier (`[offload]`: host memory, optionally
block files below it), where an evicted block is copied out and a later hit copies it back
through one bounded transfer queue. A third run injects restore failures (a missing file, a
checksum mismatch, an I/O error) on a disk-only tier and counts how many output tokens
differ from the run without a tier (the answer must be none). The simulator predicts both
runs on the same list with a step-time profile and a transfer profile (latency + bytes /
bandwidth of a host restore) measured here first, side by side.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from ctxlab.progress import Tracker
from ctxlab.workshop import eviction_workload as workload
from ctxlab.workshop.config import Section
from ctxlab.workshop.demo_eviction import DEMO as EVICTION
from ctxlab.workshop.demonstration import Demonstration, FigureValues, Metric, Risk
from ctxlab.workshop.eviction_workload import Job, SideRun, StepProfile
from ctxlab.workshop.result import Column, DemoResult, Gain, Table, fmt
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from ctxlab.engine import LLMEngine
    from ctxlab.kv.prefix_offload import OffloadStats, PrefixOffload, TransferProfile


Kind = Literal["missing", "checksum", "io"]
KINDS: tuple[Kind, ...] = ("missing", "checksum", "io")
MIB = 2**20


def steps(session: Session) -> int:
    return 6


@dataclass(frozen=True)
class ByKind:
    """A count per restore-failure kind, in `KINDS` order."""

    missing: int = 0
    checksum: int = 0
    io: int = 0

    @classmethod
    def of(cls, counts: dict[str, int]) -> ByKind:
        return cls(*(counts.get(k, 0) for k in KINDS))

    def items(self) -> tuple[tuple[Kind, int], ...]:
        return tuple((k, getattr(self, k)) for k in KINDS)

    @property
    def total(self) -> int:
        return self.missing + self.checksum + self.io


@dataclass(frozen=True)
class TierCounts:
    """What the offload tier did in one run (the engine's `OffloadStats`, the fields this
    demonstration reads, failures by kind instead of a dict)."""

    restored_tokens: int  # external_prefix_cache_hits
    recomputed_after_failure_tokens: int
    store_bytes: int  # kv_offload_store_bytes
    load_bytes: int  # kv_offload_load_bytes
    load_time_s: float  # kv_offload_load_time
    stored_blocks: int
    restored_blocks: int
    dropped_blocks: int
    restore_failures: ByKind
    load_wait_p50_s: float
    load_wait_p99_s: float
    host_used_bytes: int

    @classmethod
    def of(cls, st: OffloadStats) -> TierCounts:
        return cls(
            restored_tokens=st.external_prefix_cache_hits,
            recomputed_after_failure_tokens=st.recomputed_after_failure_tokens,
            store_bytes=st.kv_offload_store_bytes,
            load_bytes=st.kv_offload_load_bytes,
            load_time_s=st.kv_offload_load_time,
            stored_blocks=st.stored_blocks,
            restored_blocks=st.restored_blocks,
            dropped_blocks=st.dropped_blocks,
            restore_failures=ByKind.of(st.restore_failures),
            load_wait_p50_s=st.load_wait_p50_s,
            load_wait_p99_s=st.load_wait_p99_s,
            host_used_bytes=st.host_used_bytes,
        )

    @property
    def moved_bytes(self) -> int:
        return self.store_bytes + self.load_bytes


@dataclass(frozen=True)
class Transfer:
    """A restore's cost fitted on this machine: latency + bytes / bandwidth."""

    latency_s: float
    bandwidth_bytes_per_s: float
    resolved: bool  # False: the largest restore's rate, latency not told apart (busy machine)

    @classmethod
    def of(cls, p: TransferProfile) -> Transfer:
        return cls(p.latency_s, p.bandwidth_bytes_per_s, p.resolved)


@dataclass(frozen=True)
class FailureRun:
    """The disk-only tier whose block files were damaged between rounds."""

    tier: TierCounts
    injected: ByKind
    wrong: int  # output tokens that differ from the run without a tier
    tokens: int  # output tokens of the failure run


@dataclass(frozen=True)
class Records:
    """What demonstration 8 measured; every table, verdict and sentence reads these."""

    pool: int
    unique: int  # prompt tokens no earlier request had computed
    host_bytes: int  # the tier's host memory
    block_files: bool  # whether block files lie below host memory
    profile: StepProfile | None  # None: demonstration 4's, measured in this run
    host: Transfer
    disk: Transfer
    no_tier: SideRun
    tier: SideRun
    tier_counts: TierCounts
    failure: FailureRun
    sim_no_tier: SideRun
    sim_tier: SideRun


def tier_of(session: Session) -> tuple[int, str | None]:
    """(host bytes, block-file directory or None) from `[offload]`."""
    from ctxlab.plan.units import parse_bytes

    o = DEMO.config(session.cfg)
    directory = str(session.out / o.offload_dir) if o.offload_dir else None
    return parse_bytes(o.offload_bytes, "offload.offload_bytes"), directory


def _step_profile(session: Session) -> StepProfile | None:
    """Demonstration 4's step profile when it measured one in this run (same model, same
    request shapes: None), else measured now as it does."""
    ev = EVICTION.config(session.cfg)
    path = workload.profile_path(session, ev)
    fresh = path.exists() and path.stat().st_mtime >= session.started
    if ev.profile == "measure" and fresh:
        return None
    return workload.step_profile(session, ev)


def transfer_profiles(session: Session, pool: int, blocks: int) -> tuple[Transfer, Transfer]:
    """Restore cost from host memory and from disk, fitted on this machine (an idle engine
    with the demonstration's pool; scratch blocks only)."""
    llm = session.llm(pool_tokens=pool, warm_up=False)
    off = llm.engine.attach_offload(1, str(session.out / "offload-profile"))
    sizes = tuple(sorted({1, max(2, blocks // 2), max(3, blocks)}))
    try:
        host = off.measure_profile("host", sizes, repeats=3)
        disk = off.measure_profile("disk", sizes, repeats=3)
        return Transfer.of(host), Transfer.of(disk)
    finally:
        off.close()
        shutil.rmtree(session.out / "offload-profile", ignore_errors=True)


def _tier_run(
    session: Session, jobs: list[Job], pool: int, tier: tuple[int, str | None]
) -> tuple[SideRun, TierCounts]:
    holder: list[PrefixOffload] = []

    def attach(engine: LLMEngine) -> None:
        holder.append(engine.attach_offload(*tier))

    run = workload.run_engine(session, EVICTION.config(session.cfg), jobs, pool, attach)
    off = holder[0]
    off.transfers.drain()
    counts = TierCounts.of(off.stats())
    off.close()
    return run, counts


def failure_run(
    session: Session, jobs: list[Job], pool: int, expected: tuple[tuple[int, ...], ...]
) -> FailureRun:
    """Round by round (one request per group), a disk-only tier; before each later round the
    first block file of every prefix on disk is damaged, cycling through missing, checksum
    and I/O error. Returns the tier's counts and the output tokens that differ from `expected`
    (the same jobs without a tier)."""
    from ctxlab.engine import SamplingParams
    from ctxlab.kv.offload_tier import DISK

    ev = EVICTION.config(session.cfg)
    llm = session.llm(pool_tokens=pool, max_num_seqs=ev.concurrency, warm_up=False)
    engine = llm.engine
    off = engine.attach_offload(0, str(session.out / "offload-failures"))
    params = SamplingParams(max_tokens=ev.output_tokens, ignore_eos=True)
    injected = dict.fromkeys(KINDS, 0)
    turn = 0
    tokens: list[list[int]] = []
    try:
        for start in range(0, len(jobs), ev.groups):
            if start:
                off.transfers.drain()
                for job in jobs[start : start + ev.groups]:
                    h = off.hashes_of(job.ids)[0]
                    if off.tier.where(h) == DISK:
                        kind = KINDS[turn % len(KINDS)]
                        off.tier.inject(h, kind)
                        injected[kind] += 1
                        turn += 1
            rids = [engine.add_request(j.ids, params) for j in jobs[start : start + ev.groups]]
            tokens += [o.token_ids for o in engine.run_all(rids)]
        off.transfers.drain()
        st = off.stats()
    finally:
        off.close()
        shutil.rmtree(session.out / "offload-failures", ignore_errors=True)
    wrong = sum(
        sum(1 for a, b in zip(got, want, strict=False) if a != b) + abs(len(got) - len(want))
        for got, want in zip(tokens, expected, strict=True)
    )
    return FailureRun(TierCounts.of(st), ByKind.of(injected), wrong, sum(map(len, tokens)))


def measure(session: Session, tracker: Tracker) -> Records:
    """Without a tier, with one, with damaged restores, then both simulated (nothing
    formatted)."""
    ev = EVICTION.config(session.cfg)
    session.llm(pool_tokens=256)  # warms the model up outside the measured pools
    profile = _step_profile(session)
    tracker.advance()
    page = session.cfg.engine.page_size
    pool = workload.pool_tokens(ev, page)
    jobs = workload.ordered(workload.build_jobs(session, ev, page), "interleaved")
    host, directory = tier_of(session)
    host_p, disk_p = transfer_profiles(session, pool, ev.prefix_tokens // page)
    tracker.advance()
    no_tier = workload.run_engine(session, ev, jobs, pool)
    tracker.advance()
    tier, counts = _tier_run(session, jobs, pool, (host, directory))
    tracker.advance()
    fail = failure_run(session, jobs, pool, no_tier.tokens)
    tracker.advance()
    path = workload.profile_path(session, ev)
    sim_no_tier = workload.run_simulator(session, ev, jobs, pool, path)
    sim_tier = workload.run_simulator(
        session,
        ev,
        jobs,
        pool,
        path,
        offload_bytes=host,
        offload_bandwidth=host_p.bandwidth_bytes_per_s,
        offload_latency=host_p.latency_s,
    )
    tracker.advance()
    return Records(
        pool=pool,
        unique=workload.unique_tokens(ev, jobs),
        host_bytes=host,
        block_files=directory is not None,
        profile=profile,
        host=host_p,
        disk=disk_p,
        no_tier=no_tier,
        tier=tier,
        tier_counts=counts,
        failure=fail,
        sim_no_tier=sim_no_tier,
        sim_tier=sim_tier,
    )


def verdicts(r: Records, res: DemoResult) -> None:
    """The metrics the run's predictions are judged on (`res.observe`): the one place this
    demonstration judges (`ctxlab.workshop.verdicts` reads them against the config)."""
    base, tier, st, u = r.no_tier, r.tier, r.tier_counts, r.unique
    res.observe("reused_tokens", base.reused, tier.reused)
    res.observe("recomputed_tokens", base.recomputed(u), tier.recomputed(u))
    res.observe("restored_tokens", 0, st.restored_tokens)
    for q in (50, 99):
        res.observe(f"ttft_p{q}_ms", base.ttft_p(q), tier.ttft_p(q), 1)
    res.observe("bytes_moved", 0, st.moved_bytes)
    res.observe("wrong_tokens_under_failure", 0, r.failure.wrong)
    sim = r.sim_tier
    res.observe("sim_vs_engine_ttft_p50_ms", tier.ttft_p(50), sim.ttft_p(50), 1)
    res.observe("sim_vs_engine_reused_tokens", tier.reused, sim.reused)


@dataclass(frozen=True)
class Bill:
    """One engine run's self-hosted bill (rendering; `ctxlab.plan.self_hosted`)."""

    requests: int
    failed: int
    moved_bytes: int
    held_bytes: int | None
    per_request_1000: float
    per_1000: float  # per 1,000 successes
    per_mtok: float


def bill(session: Session, run: SideRun, counts: TierCounts | None, failed: int) -> Bill:
    """The run's measured work (CPU seconds, KV bytes moved, tier memory held over the
    makespan) billed over its requests, `failed` of them counted as failed."""
    from ctxlab.plan.self_hosted import Usage, self_hosted_bill

    n = len(run.ttft_ms)
    failed = min(failed, n - 1)
    moved = 0 if counts is None else counts.moved_bytes
    held = 0 if counts is None else counts.host_used_bytes
    usage = Usage(
        device_seconds=0.0,
        succeeded=n - failed,
        failed=failed,
        cpu_seconds=run.cpu_s or 0.0,
        network_bytes=moved,
        storage_byte_seconds=held * run.makespan_s,
        tokens=run.queried + sum(map(len, run.tokens)),
    )
    b = self_hosted_bill(usage, session.cfg.cost.self_hosted_prices())
    held_cell = None if counts is None else held
    return Bill(
        n, failed, moved, held_cell, b.per_request * 1000, b.per_success * 1000,
        (b.per_token or 0.0) * 1e6,
    )  # fmt: skip


def run(session: Session, tracker: Tracker) -> DemoResult:
    """Measure, judge, then render the tables and prose from the records."""
    records = measure(session, tracker)
    res = DemoResult.of(DEMO, "run", "measured and modeled")
    failed = records.failure.tier.restore_failures.total
    bills = {
        "no tier": bill(session, records.no_tier, None, 0),
        "tier": bill(session, records.tier, records.tier_counts, 0),
    }
    if failed:
        bills["tier, failed"] = bill(session, records.tier, records.tier_counts, failed)
    _tables(session, res, records, bills)
    verdicts(records, res)
    _explain(session, res, records, bills)
    return res


def _profile_label(res: DemoResult, r: Records) -> str:
    if r.profile is None:
        return "the profile demonstration 4 measured on this machine in this run"
    return workload.profile_label(res.figures, r.profile)


def _tables(session: Session, res: DemoResult, r: Records, bills: dict[str, Bill]) -> None:
    ev = EVICTION.config(session.cfg)
    profile_label = _profile_label(res, r)
    host, pool = r.host_bytes, r.pool
    where = f"{host / MIB:,.1f} MiB of host memory" + (" and block files" if r.block_files else "")
    storage = Table(
        "offload_storage",
        "storage",
        f"Demonstration 8: {len(r.no_tier.ttft_ms)} interleaved requests, a pool "
        f"of {pool:,} tokens for {ev.groups} prefixes of {ev.prefix_tokens:,} tokens, a tier "
        f"of {where}",
        "measured and modeled",
        [
            Column("run"),
            Column("reused tokens"),
            Column("restored tokens"),
            Column("recomputed tokens"),
            Column("evicted blocks"),
            Column("blocks stored"),
            Column("blocks restored"),
            Column("MiB stored", 1),
            Column("MiB restored", 1),
            Column("restore failures"),
        ],
        note="engine rows are measured, simulator rows modeled on the same request list; "
        "recomputed = computed prompt tokens minus tokens no earlier request had computed; "
        "the failure run is the engine with a disk-only tier whose files were damaged between "
        "rounds",
    )
    runs: tuple[tuple[str, SideRun, TierCounts | None], ...] = (
        ("engine, no tier", r.no_tier, None),
        ("engine, tier", r.tier, r.tier_counts),
        ("simulator, no tier", r.sim_no_tier, None),
        ("simulator, tier", r.sim_tier, None),
    )
    for name, run_, st in runs:
        recomputed = run_.recomputed(r.unique)
        if st is not None:
            cells = (
                st.restored_tokens,
                recomputed,
                run_.evictions,
                st.stored_blocks,
                st.restored_blocks,
                st.store_bytes / MIB,
                st.load_bytes / MIB,
                st.restore_failures.total,
            )
        else:
            moved = run_.transfer_bytes / MIB
            cells = (run_.restored, recomputed, run_.evictions, None, None, None)
            cells += (moved if name.startswith("simulator") else None, None)
        storage.add(name, run_.reused, *cells)
    fs = r.failure.tier
    storage.add(
        "engine, tier, injected failures",
        None,
        fs.restored_tokens,
        None,
        None,
        fs.stored_blocks,
        fs.restored_blocks,
        fs.store_bytes / MIB,
        fs.load_bytes / MIB,
        fs.restore_failures.total,
    )
    hp, dp = r.host, r.disk
    serving = Table(
        "offload_serving",
        "serving",
        f"Demonstration 8: TTFT when all requests arrive together, at most {ev.concurrency} "
        "running",
        "measured and modeled",
        [
            Column("run"),
            Column("TTFT p50 ms", 1),
            Column("TTFT p95 ms", 1),
            Column("TTFT p99 ms", 1),
            Column("makespan s", 2),
            Column("restore queue wait p50 ms", 2),
            Column("restore queue wait p99 ms", 2),
            Column("restore seconds", 3),
        ],
        note=f"simulator step times: {profile_label}; its tier moves blocks at the host "
        f"restore profile measured here: {hp.latency_s * 1e3:.2f} ms + bytes at "
        f"{hp.bandwidth_bytes_per_s / 2**30:.2f} GiB/s (disk: {dp.latency_s * 1e3:.2f} ms + "
        f"{dp.bandwidth_bytes_per_s / 2**30:.2f} GiB/s); the simulator models one host tier "
        "and no disk"
        + "".join(
            f"; the {name} profile's times did not grow with the bytes (a busy machine), so it "
            "is the largest restore's rate at zero latency, an upper bound"
            for name, p in (("host", hp), ("disk", dp))
            if not p.resolved
        ),
    )
    for name, run_, st in runs:
        waits = (
            (st.load_wait_p50_s * 1e3, st.load_wait_p99_s * 1e3, st.load_time_s)
            if st is not None
            else (None, None, None)
        )
        serving.add(
            name, run_.ttft_p(50), run_.ttft_p(95), run_.ttft_p(99), run_.makespan_s, *waits
        )
    res.tables += [storage, serving, _cost_table(session, r, bills)]


def _cost_table(session: Session, r: Records, bills: dict[str, Bill]) -> Table:
    """The self-hosted bill of each engine run, every term of the storage formula
    (`ctxlab.plan.self_hosted`), and the tier run again with its damaged restores counted as
    failed requests: the same machine work over fewer answers."""
    cur = session.cfg.cost.currency
    prices = session.cfg.cost.self_hosted_prices()
    cost = Table(
        "offload_cost",
        "cost",
        "Demonstration 8: self-hosted cost of the whole request list (engine)",
        "measured",
        [
            Column("run"),
            Column("requests ok/failed"),
            Column("computed prompt tokens"),
            Column("CPU seconds", 2),
            Column("KV bytes moved MiB", 1),
            Column("tier memory held MiB", 1),
            Column(f"{cur} per 1,000 requests", 4),
            Column(f"{cur} per 1,000 successes", 4),
            Column(f"{cur} per 1M tokens", 4),
        ],
        note=f"every term of the storage formula: CPU seconds at {prices.cpu_hourly} {cur}/h, "
        f"KV bytes moved to and from the tier (the engine's kv_offload_store_bytes and "
        f"kv_offload_load_bytes) at {prices.network_per_gb} {cur}/GB (0: they move inside this "
        f"machine), the tier's memory held "
        f"over the run's makespan at {prices.storage_per_gb_month} {cur}/GB-month; no device "
        "and no idle reserve on this CPU machine. Per 1M tokens: every prompt and output token "
        "processed. The last row is the tier run's measured work with the requests whose "
        "restore was damaged in the failure run counted as failed (accounting, not a run: "
        "ctxlab recomputes them instead)",
    )
    failed = r.failure.tier.restore_failures.total
    rows = [("engine, no tier", "no tier", r.no_tier), ("engine, tier", "tier", r.tier)]
    if "tier, failed" in bills:
        rows.append(
            (f"engine, tier, {failed} restores failed their requests", "tier, failed", r.tier)
        )
    for name, which, run_ in rows:
        b = bills[which]
        cost.add(
            name,
            f"{b.requests - b.failed}/{b.failed}",
            run_.computed,
            run_.cpu_s,
            b.moved_bytes / MIB,
            None if b.held_bytes is None else b.held_bytes / MIB,
            b.per_request_1000,
            b.per_1000,
            b.per_mtok,
        )
    return cost


def _explain(session: Session, res: DemoResult, r: Records, bills: dict[str, Bill]) -> None:
    f = res.figures
    base, tier, sim, u = r.no_tier, r.tier, r.sim_tier, r.unique
    st, fs, fail = r.tier_counts, r.failure.tier, r.failure
    n = len(base.ttft_ms)
    res.summary = (
        f"{f.say('requests', n)} interleaved requests on a pool of "
        f"{f.say('pool_tokens', r.pool)} tokens, without and with a tier of "
        f"{f.say('tier_mib', r.host_bytes / MIB, 1)} MiB of host memory."
    )
    res.gains.append(
        Gain(
            "a second tier against recompute",
            f"without the tier the pool evicted {f.say('evictions_no_tier', base.evictions)} "
            f"blocks and {f.say('recomputed_no_tier', base.recomputed(u))} tokens an earlier "
            f"request had computed were computed again; with it, "
            f"{f.say('stored_blocks', st.stored_blocks)} evicted blocks were copied out "
            f"({f.say('stored_mib', st.store_bytes / MIB, 1)} MiB), "
            f"{f.say('restored_blocks', st.restored_blocks)} came back "
            f"({f.say('restored_tokens', st.restored_tokens)} tokens, "
            f"{f.say('restored_mib', st.load_bytes / MIB, 1)} MiB) and "
            f"{f.say('recomputed_tier', tier.recomputed(u))} tokens were recomputed; "
            f"{f.say('dropped_blocks', st.dropped_blocks)} blocks fell off the tier",
            f"TTFT p50 {f.say('ttft_p50_no_tier', base.ttft_p(50), 1)} ms -> "
            f"{f.say('ttft_p50_tier', tier.ttft_p(50), 1)} ms and p99 "
            f"{f.say('ttft_p99_no_tier', base.ttft_p(99), 1)} -> "
            f"{f.say('ttft_p99_tier', tier.ttft_p(99), 1)} ms; the list cost "
            f"{f.say('cost_no_tier', bills['no tier'].per_1000, 4)} against "
            f"{f.say('cost_tier', bills['tier'].per_1000, 4)} {session.cfg.cost.currency} per "
            "1,000 requests (CPU time, KV bytes moved, tier memory held); each restore waited "
            f"{f.say('restore_wait_p50_ms', st.load_wait_p50_s * 1e3, 2)} ms (p50) and "
            f"{f.say('restore_wait_p99_ms', st.load_wait_p99_s * 1e3, 2)} ms (p99) in the "
            "transfer queue",
        )
    )
    kinds = ", ".join(f"{v} {k}" for k, v in fail.injected.items() if v)
    f.say("injected_failures", fail.injected.total)
    f.say("failed_restores", fs.restore_failures.total)
    res.gains.append(
        Gain(
            "a restore that fails",
            f"{f.say('injected_kinds', kinds)} injected into the disk tier: "
            f"{fs.restore_failures.total} restores failed and their requests "
            f"recomputed {f.say('failure_recomputed_tokens', fs.recomputed_after_failure_tokens)}"
            f" tokens, while {f.say('failure_restored_tokens', fs.restored_tokens)} "
            "tokens of other requests were still restored",
            f"{f.say('wrong_tokens', fail.wrong)} of "
            f"{f.say('failure_run_tokens', fail.tokens)} output tokens differ from the run "
            "without a tier: a failure costs that request its prefill time, never its answer",
        )
    )
    billed = bills.get("tier, failed")
    if billed:
        ok = bills["tier"]
        cur = session.cfg.cost.currency
        res.gains.append(
            Gain(
                "a failed request, billed",
                f"counting the {f.say('billed_failed_requests', billed.failed)} requests whose "
                "restore was damaged as failed, the tier run's measured work (CPU seconds, KV "
                "bytes moved, tier memory held) is unchanged and answers fewer requests",
                f"cost per 1,000 successes {f.say('cost_per_1000_ok', ok.per_1000, 4)} -> "
                f"{f.say('cost_per_1000_failed', billed.per_1000, 4)} {cur}, while cost per "
                f"1M tokens stays {f.say('cost_per_mtok_ok', ok.per_mtok, 4)} -> "
                f"{f.say('cost_per_mtok_failed', billed.per_mtok, 4)} {cur}: failures are "
                "paid for by the answers that succeed",
            )
        )
    hp = r.host
    f.say("host_latency_ms", hp.latency_s * 1e3, 3)
    f.say("host_gib_s", hp.bandwidth_bytes_per_s / 2**30, 2)
    f.say("disk_latency_ms", r.disk.latency_s * 1e3, 3)
    f.say("disk_gib_s", r.disk.bandwidth_bytes_per_s / 2**30, 2)
    res.gains.append(
        Gain(
            "predicting it without running it (simulator)",
            f"with the measured transfer profile ({hp.latency_s * 1e3:.2f} ms + "
            f"{hp.bandwidth_bytes_per_s / 2**30:.2f} GiB/s) the simulator predicted "
            f"{f.say('sim_reused_tier', sim.reused)} reused tokens "
            f"({f.say('sim_restored_tier', sim.restored)} from its tier) against "
            f"{tier.reused:,} measured",
            f"it predicted TTFT p50 {f.say('sim_ttft_p50_tier', sim.ttft_p(50), 1)} ms with the "
            f"tier against {tier.ttft_p(50):,.1f} ms measured, and "
            f"{f.say('sim_ttft_p50_no_tier', r.sim_no_tier.ttft_p(50), 1)} ms "
            f"without it against {base.ttft_p(50):,.1f} ms",
        )
    )
    res.notes.append(
        "A restore is synchronous for its request: the scheduler waits for the copy before "
        "the request's first step, so a slow tier shows in that request's TTFT and in the "
        "queue-wait column, never in other requests' tokens."
    )


# -- declarations ---------------------------------------------------------------------------


class OffloadSection(Section):
    """Demonstration 8: demonstration 4's workload with the prefix cache's offload tier."""

    offload_bytes: str = Field(min_length=1)  # host memory, e.g. "128MiB" (0: disk only)
    offload_dir: str = ""  # "": host memory only; a folder under the run's output directory

    @field_validator("offload_bytes")
    @classmethod
    def _bytes(cls, text: str) -> str:
        from ctxlab.errors import CtxlabError
        from ctxlab.plan.units import parse_bytes

        try:
            size = parse_bytes(text, "offload.offload_bytes")
        except CtxlabError as exc:
            raise ValueError(str(exc)) from None
        if size < 0:
            raise ValueError("offload.offload_bytes must be zero or more")
        return text

    @field_validator("offload_dir")
    @classmethod
    def _inside(cls, name: str) -> str:
        from ctxlab.errors import CtxlabError
        from ctxlab.outputs import check_inside

        try:
            return check_inside(name, "offload.offload_dir") if name else name
        except CtxlabError as exc:
            raise ValueError(str(exc).rstrip(".")) from None

    @model_validator(mode="after")
    def _somewhere(self) -> OffloadSection:
        from ctxlab.plan.units import parse_bytes

        if parse_bytes(self.offload_bytes) == 0 and not self.offload_dir:
            raise ValueError("offload.offload_bytes 0 keeps nothing; give a size or offload_dir")
        return self


_NO_TIER, _TIER = "no offload tier (engine, interleaved)", "offload tier (engine, interleaved)"
METRICS = (
    Metric("reused_tokens", "tokens", _NO_TIER, _TIER, "prompt tokens served by the cache"),
    Metric(
        "recomputed_tokens",
        "tokens",
        _NO_TIER,
        _TIER,
        "prompt tokens computed although an earlier request had computed them",
    ),
    Metric("restored_tokens", "tokens", _NO_TIER, _TIER, "prompt tokens restored from the tier"),
    Metric("ttft_p50_ms", "ms", _NO_TIER, _TIER, "median time to first token"),
    Metric("ttft_p99_ms", "ms", _NO_TIER, _TIER, "99th percentile time to first token"),
    Metric(
        "bytes_moved", "bytes", _NO_TIER, _TIER, "KV bytes stored to and restored from the tier"
    ),
    Metric(
        "wrong_tokens_under_failure",
        "tokens",
        "no offload tier (engine)",
        "tier with injected restore failures (engine)",
        "output tokens that differ from the run without a tier",
    ),
    Metric(
        "sim_vs_engine_ttft_p50_ms",
        "ms",
        "engine, offload tier",
        "simulator, offload tier (measured transfer profile)",
        "the simulator's median TTFT prediction",
    ),
    Metric(
        "sim_vs_engine_reused_tokens",
        "tokens",
        "engine, offload tier",
        "simulator, offload tier",
        "the simulator's reuse prediction on the same request list",
    ),
)

TOML = """\
# -- 8: a second tier for the prefix cache (demonstration 4's workload, [eviction]) ---------
[offload]
offload_bytes = "128MiB"      # host memory for evicted prefix-cache blocks (like vLLM's CPU
                              # offload); enough for every prefix here, so nothing is dropped
offload_dir = ""              # "": host memory only; a folder (under the run's output) puts
                              # block files below host memory, one LRU across both
"""

PREDICTIONS_TOML = """\
[predictions.offload]         # baseline: interleaved, no tier; observed: the same with the tier
reused_tokens = { direction = "up" }
recomputed_tokens = { direction = "down" }
restored_tokens = { direction = "up" }
ttft_p50_ms = { direction = "down" }
ttft_p99_ms = { direction = "down" }
bytes_moved = { direction = "up" }
# every injected restore failure recomputes its request: not one output token may differ
wrong_tokens_under_failure = { direction = "unchanged", tolerance = 0.0, range = [0, 0] }
# the simulator's tier moves blocks at the transfer profile measured just before
sim_vs_engine_ttft_p50_ms = { direction = "unchanged", tolerance = 0.25 }
sim_vs_engine_reused_tokens = { direction = "unchanged", tolerance = 0.1 }
"""

QUICK_TOML = """\
[quick.offload]
offload_bytes = "32MiB"
"""


def _guard_pricing(f: FigureValues) -> tuple[str, str]:
    if f.get("billed_failed_requests") is None:
        return "partly guarded", (
            f"demonstration {DEMO.number} bills CPU seconds, KV bytes moved and tier memory "
            "held, but no restore failed in this run, so no failure was billed"
        )
    return "partly guarded", (
        f"demonstration {DEMO.number} bills every term it measures (CPU seconds, KV bytes "
        f"moved, tier memory held) and, counting {fmt(f['billed_failed_requests'])} requests "
        f"with damaged restores as failed, cost per 1,000 successes rises "
        f"{fmt(f['cost_per_1000_ok'], 4)} -> {fmt(f['cost_per_1000_failed'], 4)} while cost "
        f"per 1M tokens stays {fmt(f['cost_per_mtok_failed'], 4)}; idle reserve is priced by "
        "`ctxlab plan --idle-reserve`, not measured here"
    )


def _guard_offload(f: FigureValues) -> tuple[str, str]:
    return "guarded", (
        f"demonstration {DEMO.number} ran the prefix cache's tier "
        f"({fmt(f['tier_mib'], 1)} MiB of host memory) through one bounded transfer queue: "
        f"{fmt(f['restored_blocks'])} restores "
        f"of {fmt(f['stored_blocks'])} stored blocks, each waiting "
        f"{fmt(f['restore_wait_p50_ms'], 2)} ms (p50) and {fmt(f['restore_wait_p99_ms'], 2)} ms "
        f"(p99) behind other transfers, {fmt(f['dropped_blocks'])} blocks dropped for "
        f"capacity; {fmt(f['injected_failures'])} injected restore failures "
        f"({f['injected_kinds']}) recomputed {fmt(f['failure_recomputed_tokens'])} tokens "
        f"with {fmt(f['wrong_tokens'])} wrong output tokens"
    )


DEMO = Demonstration(
    number=8,
    key="offload",
    title="A second tier for the prefix cache",
    section=OffloadSection,
    metrics=METRICS,
    layers=("storage", "serving", "cost"),
    steps=steps,
    run=run,
    toml=TOML,
    predictions_toml=PREDICTIONS_TOML,
    quick_toml=QUICK_TOML,
    guards=((Risk.OFFLOAD, _guard_offload), (Risk.PRICING, _guard_pricing)),
    required=("restored_tokens", "wrong_tokens_under_failure"),
)
