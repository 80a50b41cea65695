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

import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from ctxlab.progress import Tracker
from ctxlab.workshop import eviction_workload as workload
from ctxlab.workshop.config import Section
from ctxlab.workshop.demo_eviction import DEMO as EVICTION
from ctxlab.workshop.demonstration import Demonstration, FigureValues, Metric, Risk
from ctxlab.workshop.eviction_workload import Job
from ctxlab.workshop.result import Column, DemoResult, Gain, Table, fmt
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from ctxlab.engine import LLMEngine


KINDS = ("missing", "checksum", "io")
MIB = 2**20


def steps(session: Session) -> int:
    return 6


def tier_of(session: Session) -> tuple[int, str | None]:
    """(host bytes, block-file directory or None) from `[offload]`."""
    from ctxlab.plan.units import parse_bytes

    o = DEMO.config(session.cfg)
    directory = str(session.out / o.offload_dir) if o.offload_dir else None
    return parse_bytes(o.offload_bytes, "offload.offload_bytes"), directory


def _step_profile(session: Session, res: DemoResult) -> tuple[Path, str]:
    """Demonstration 4's step profile when it measured one in this run (same model, same
    request shapes), else measured now as it does."""
    path = session.out / "step-profile.json"
    fresh = path.exists() and path.stat().st_mtime >= _process_start()
    if EVICTION.config(session.cfg).profile == "measure" and fresh:
        return path, "the profile demonstration 4 measured on this machine in this run"
    profile = workload.step_profile(session, EVICTION.config(session.cfg))
    return profile.path, workload.profile_label(res.figures, profile)


def _process_start() -> float:
    """When this process started (Linux); elsewhere now, so nothing older is reused."""
    try:
        return os.stat(f"/proc/{os.getpid()}").st_ctime
    except OSError:
        return time.time()


def transfer_profiles(session: Session, pool: int, blocks: int) -> dict[str, Any]:
    """Restore cost from host memory and from disk, fitted on this machine (an idle engine
    with the demonstration's pool; scratch blocks only)."""
    llm = session.llm(pool_tokens=pool, warm_up=False)
    off = llm.engine.attach_offload(1, str(session.out / "offload-profile"))
    sizes = tuple(sorted({1, max(2, blocks // 2), max(3, blocks)}))
    try:
        return {tier: off.measure_profile(tier, sizes, repeats=3) for tier in ("host", "disk")}
    finally:
        off.close()
        shutil.rmtree(session.out / "offload-profile", ignore_errors=True)


def _stats_run(session: Session, jobs: list[Job], pool: int, tier: tuple, unique: int) -> dict:
    holder: dict[str, Any] = {}

    def attach(engine: LLMEngine) -> None:
        holder["off"] = engine.attach_offload(*tier)

    ev = EVICTION.config(session.cfg)
    run = workload.run_engine(session, ev, jobs, pool, attach).as_dict(unique)
    off = holder["off"]
    off.transfers.drain()
    run["offload"] = off.stats()
    off.close()
    return run


def failure_run(session: Session, jobs: list[Job], pool: int, expected: list[list[int]]) -> dict:
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
    injected = {k: 0 for k in KINDS}
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
    return {"offload": st, "injected": injected, "wrong": wrong, "tokens": sum(map(len, tokens))}


def run(session: Session, tracker: Tracker) -> DemoResult:
    ev = EVICTION.config(session.cfg)
    res = DemoResult.of(DEMO, "run", "measured and modeled")
    session.llm(pool_tokens=256)  # warms the model up outside the measured pools
    profile, profile_label = _step_profile(session, res)
    tracker.advance()
    page = session.cfg.engine.page_size
    pool = workload.pool_tokens(ev, page)
    jobs = workload.ordered(workload.build_jobs(session, ev, page), "interleaved")
    unique = workload.unique_tokens(ev, jobs)
    host, directory = tier_of(session)
    prefix_blocks = ev.prefix_tokens // session.cfg.engine.page_size
    transfer = transfer_profiles(session, pool, prefix_blocks)
    tracker.advance()
    no_tier = workload.run_engine(session, ev, jobs, pool).as_dict(unique)
    runs: dict[str, dict] = {"engine, no tier": no_tier}
    tracker.advance()
    runs["engine, tier"] = _stats_run(session, jobs, pool, (host, directory), unique)
    tracker.advance()
    fail = failure_run(session, jobs, pool, runs["engine, no tier"]["tokens"])
    tracker.advance()
    hp = transfer["host"]
    sim = workload.run_simulator(session, ev, jobs, pool, profile)
    runs["simulator, no tier"] = sim.as_dict(unique)
    runs["simulator, tier"] = workload.run_simulator(
        session,
        ev,
        jobs,
        pool,
        profile,
        offload_bytes=host,
        offload_bandwidth=hp.bandwidth_bytes_per_s,
        offload_latency=hp.latency_s,
    ).as_dict(unique)
    tracker.advance()
    _tables(session, res, runs, fail, transfer, pool, host, directory, profile_label)
    base, tier = runs["engine, no tier"], runs["engine, tier"]
    st = tier["offload"]
    res.observe("reused_tokens", base["reused"], tier["reused"])
    res.observe("recomputed_tokens", base["recomputed"], tier["recomputed"])
    res.observe("restored_tokens", 0, st.external_prefix_cache_hits)
    for q in (50, 99):
        res.observe(f"ttft_p{q}_ms", base[f"ttft_p{q}"], tier[f"ttft_p{q}"], 1)
    res.observe("bytes_moved", 0, st.kv_offload_store_bytes + st.kv_offload_load_bytes)
    res.observe("wrong_tokens_under_failure", 0, fail["wrong"])
    sim = runs["simulator, tier"]
    res.observe("sim_vs_engine_ttft_p50_ms", tier["ttft_p50"], sim["ttft_p50"], 1)
    res.observe("sim_vs_engine_reused_tokens", tier["reused"], sim["reused"])
    _explain(session, res, runs, fail, transfer, host, pool)
    return res


def _tables(
    session: Session,
    res: DemoResult,
    runs: dict[str, dict],
    fail: dict,
    transfer: dict,
    pool: int,
    host: int,
    directory: str | None,
    profile_label: str,
) -> None:
    ev = EVICTION.config(session.cfg)
    where = f"{host / MIB:,.1f} MiB of host memory" + (" and block files" if directory else "")
    storage = Table(
        "offload_storage",
        "storage",
        f"Demonstration 8: {len(runs['engine, no tier']['ttft_ms'])} interleaved requests, a pool "
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
    for name, r in runs.items():
        st = r.get("offload")
        if st is not None:
            cells = (
                st.external_prefix_cache_hits,
                r["recomputed"],
                r["evictions"],
                st.stored_blocks,
                st.restored_blocks,
                st.kv_offload_store_bytes / MIB,
                st.kv_offload_load_bytes / MIB,
                sum(st.restore_failures.values()),
            )
        else:
            moved = r.get("transfer_bytes", 0) / MIB
            cells = (r.get("restored", 0), r["recomputed"], r["evictions"], None, None, None)
            cells += (moved if name.startswith("simulator") else None, None)
        storage.add(name, r["reused"], *cells)
    fs = fail["offload"]
    storage.add(
        "engine, tier, injected failures",
        None,
        fs.external_prefix_cache_hits,
        None,
        None,
        fs.stored_blocks,
        fs.restored_blocks,
        fs.kv_offload_store_bytes / MIB,
        fs.kv_offload_load_bytes / MIB,
        sum(fs.restore_failures.values()),
    )
    hp, dp = transfer["host"], transfer["disk"]
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
        "and no disk",
    )
    for name, r in runs.items():
        st = r.get("offload")
        waits = (
            (st.load_wait_p50_s * 1e3, st.load_wait_p99_s * 1e3, st.kv_offload_load_time)
            if st is not None
            else (None, None, None)
        )
        serving.add(name, r["ttft_p50"], r["ttft_p95"], r["ttft_p99"], r["makespan_s"], *waits)
    cost = _cost_table(session, runs, fail)
    res.tables += [storage, serving, cost]


def _cost_table(session: Session, runs: dict[str, dict], fail: dict) -> Table:
    """The self-hosted bill of each engine run, every term of the storage formula
    (`ctxlab.plan.self_hosted`), and the tier run again with its damaged restores counted as
    failed requests: the same machine work over fewer answers."""
    from ctxlab.plan.self_hosted import Usage, self_hosted_bill

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
    failed = sum(fail["offload"].restore_failures.values())
    rows = [("engine, no tier", 0), ("engine, tier", 0)]
    if failed:
        rows.append((f"engine, tier, {failed} restores failed their requests", failed))
    for name, nfail in rows:
        r = runs["engine, tier" if nfail else name]
        n = len(r["ttft_ms"])
        nfail = min(nfail, n - 1)
        st = r.get("offload")
        moved = 0 if st is None else st.kv_offload_store_bytes + st.kv_offload_load_bytes
        held = 0 if st is None else st.host_used_bytes
        usage = Usage(
            device_seconds=0.0,
            succeeded=n - nfail,
            failed=nfail,
            cpu_seconds=r["cpu_s"],
            network_bytes=moved,
            storage_byte_seconds=held * r["makespan_s"],
            tokens=r["queried"] + sum(map(len, r["tokens"])),
        )
        bill = self_hosted_bill(usage, prices)
        per_token = bill.per_token or 0.0
        side = "billed_failures" if nfail else "billed"
        r[side] = {
            "failed": nfail,
            "per_1000": bill.per_success * 1000,
            "per_mtok": per_token * 1e6,
        }
        if not nfail:
            r["cost_per_1000"] = bill.per_success * 1000
        cost.add(
            name,
            f"{n - nfail}/{nfail}",
            r["computed"],
            r["cpu_s"],
            moved / MIB,
            None if st is None else held / MIB,
            bill.per_request * 1000,
            bill.per_success * 1000,
            per_token * 1e6,
        )
    return cost


def _explain(
    session: Session,
    res: DemoResult,
    runs: dict[str, dict],
    fail: dict,
    transfer: dict,
    host: int,
    pool: int,
) -> None:
    f = res.figures
    base, tier = runs["engine, no tier"], runs["engine, tier"]
    sim = runs["simulator, tier"]
    st, fs = tier["offload"], fail["offload"]
    n = len(base["ttft_ms"])
    res.summary = (
        f"{f.say('requests', n)} interleaved requests on a pool of "
        f"{f.say('pool_tokens', pool)} tokens, without and with a tier of "
        f"{f.say('tier_mib', host / MIB, 1)} MiB of host memory."
    )
    res.gains.append(
        Gain(
            "a second tier against recompute",
            f"without the tier the pool evicted {f.say('evictions_no_tier', base['evictions'])} "
            f"blocks and {f.say('recomputed_no_tier', base['recomputed'])} tokens an earlier "
            f"request had computed were computed again; with it, "
            f"{f.say('stored_blocks', st.stored_blocks)} evicted blocks were copied out "
            f"({f.say('stored_mib', st.kv_offload_store_bytes / MIB, 1)} MiB), "
            f"{f.say('restored_blocks', st.restored_blocks)} came back "
            f"({f.say('restored_tokens', st.external_prefix_cache_hits)} tokens, "
            f"{f.say('restored_mib', st.kv_offload_load_bytes / MIB, 1)} MiB) and "
            f"{f.say('recomputed_tier', tier['recomputed'])} tokens were recomputed; "
            f"{f.say('dropped_blocks', st.dropped_blocks)} blocks fell off the tier",
            f"TTFT p50 {f.say('ttft_p50_no_tier', base['ttft_p50'], 1)} ms -> "
            f"{f.say('ttft_p50_tier', tier['ttft_p50'], 1)} ms and p99 "
            f"{f.say('ttft_p99_no_tier', base['ttft_p99'], 1)} -> "
            f"{f.say('ttft_p99_tier', tier['ttft_p99'], 1)} ms; the list cost "
            f"{f.say('cost_no_tier', base['cost_per_1000'], 4)} against "
            f"{f.say('cost_tier', tier['cost_per_1000'], 4)} {session.cfg.cost.currency} per "
            "1,000 requests (CPU time, KV bytes moved, tier memory held); each restore waited "
            f"{f.say('restore_wait_p50_ms', st.load_wait_p50_s * 1e3, 2)} ms (p50) and "
            f"{f.say('restore_wait_p99_ms', st.load_wait_p99_s * 1e3, 2)} ms (p99) in the "
            "transfer queue",
        )
    )
    kinds = ", ".join(f"{v} {k}" for k, v in fail["injected"].items() if v)
    f.say("injected_failures", sum(fail["injected"].values()))
    f.say("failed_restores", sum(fs.restore_failures.values()))
    res.gains.append(
        Gain(
            "a restore that fails",
            f"{f.say('injected_kinds', kinds)} injected into the disk tier: "
            f"{sum(fs.restore_failures.values())} restores failed and their requests "
            f"recomputed {f.say('failure_recomputed_tokens', fs.recomputed_after_failure_tokens)}"
            f" tokens, while {f.say('failure_restored_tokens', fs.external_prefix_cache_hits)} "
            "tokens of other requests were still restored",
            f"{f.say('wrong_tokens', fail['wrong'])} of "
            f"{f.say('failure_run_tokens', fail['tokens'])} output tokens differ from the run "
            "without a tier: a failure costs that request its prefill time, never its answer",
        )
    )
    billed = tier.get("billed_failures")
    if billed:
        ok = tier["billed"]
        cur = session.cfg.cost.currency
        res.gains.append(
            Gain(
                "a failed request, billed",
                f"counting the {f.say('billed_failed_requests', billed['failed'])} requests whose "
                "restore was damaged as failed, the tier run's measured work (CPU seconds, KV "
                "bytes moved, tier memory held) is unchanged and answers fewer requests",
                f"cost per 1,000 successes {f.say('cost_per_1000_ok', ok['per_1000'], 4)} -> "
                f"{f.say('cost_per_1000_failed', billed['per_1000'], 4)} {cur}, while cost per "
                f"1M tokens stays {f.say('cost_per_mtok_ok', ok['per_mtok'], 4)} -> "
                f"{f.say('cost_per_mtok_failed', billed['per_mtok'], 4)} {cur}: failures are "
                "paid for by the answers that succeed",
            )
        )
    hp = transfer["host"]
    f.say("host_latency_ms", hp.latency_s * 1e3, 3)
    f.say("host_gib_s", hp.bandwidth_bytes_per_s / 2**30, 2)
    f.say("disk_latency_ms", transfer["disk"].latency_s * 1e3, 3)
    f.say("disk_gib_s", transfer["disk"].bandwidth_bytes_per_s / 2**30, 2)
    res.gains.append(
        Gain(
            "predicting it without running it (simulator)",
            f"with the measured transfer profile ({hp.latency_s * 1e3:.2f} ms + "
            f"{hp.bandwidth_bytes_per_s / 2**30:.2f} GiB/s) the simulator predicted "
            f"{f.say('sim_reused_tier', sim['reused'])} reused tokens "
            f"({f.say('sim_restored_tier', sim['restored'])} from its tier) against "
            f"{tier['reused']:,} measured",
            f"it predicted TTFT p50 {f.say('sim_ttft_p50_tier', sim['ttft_p50'], 1)} ms with the "
            f"tier against {tier['ttft_p50']:,.1f} ms measured, and "
            f"{f.say('sim_ttft_p50_no_tier', runs['simulator, no tier']['ttft_p50'], 1)} ms "
            f"without it against {base['ttft_p50']:,.1f} ms",
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
