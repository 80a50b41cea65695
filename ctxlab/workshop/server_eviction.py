"""Demonstration 4 through a server: interleaved prefixes that really evict its cache, with
the simulator's prediction from a probed profile, written before the server is measured.

A server's pool cannot be set from outside, so the demonstration is sized to the server
instead: the probe's capacity section (`ctxlab.probe.capacity`, fill until the cache
evicts) measures how much prefix the cache keeps, and the prefix groups are made larger
than that, by the config's `pool_share` (the pool holds that share of the groups'
prefixes), so the interleaved order evicts whatever kind of cache the server has:

- a paged cache (vLLM, SGLang, `ctxlab serve`) keeps about C tokens: prefixes of
  C / (pool_share x groups) tokens, in whole probed pages (more groups when one prefix
  would pass the server's context length);
- a cache of whole prompts per slot (llama.cpp) keeps about N prompts: N + 2 groups or
  more, so N other prompts always come between two requests of a group when interleaved.

Then a step profile of the server is probed (`ctxlab.probe.steptime`, shaped like these
requests), and the simulator replays both orders with that profile, the probed page size
and the probed capacity as its pool. Its prediction is written to `eviction-prediction.json`
before the first measured request is sent. Both orders then go to the server: all requests
arrive at once, at most `concurrency` in flight, so TTFT (from the common start) includes
the client-side queue, as the simulator's does. Evicted blocks are counted from the
server's KV events (BlockRemoved, vLLM's format) while each order runs, when its
`[[servers]]` entry names `kv_events`; otherwise, and for preemptions, which no server
reports, the figure is "not measurable" with the reason.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxlab.errors import CtxlabError
from ctxlab.probe import capacity, steptime
from ctxlab.probe.calibration import calibrate
from ctxlab.probe.client import Budget, BudgetSpent, ProbeClient
from ctxlab.probe.figures import Figure
from ctxlab.workshop.eviction_workload import ORDERS, EvictionSection
from ctxlab.workshop.measure import Timer, pct
from ctxlab.workshop.result import Column, DemoResult, Gain, Table
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ctxlab.kvevents.residency import Residency
    from ctxlab.probe.events import EventListener
    from ctxlab.workshop.demonstration import Demonstration
    from ctxlab.workshop.server_backend import ServerLLM
    from ctxlab.workshop.server_findings import ServerRun


SUBSCRIBE_S = 0.5  # seconds a new KV-event subscription is given before requests are sent
MAX_REQUESTS = 96  # requests one order may send; a larger cache is "not measurable" here
CAPACITY_REQUESTS = 400  # the capacity section's budget (it sends until the cache evicts)
NOT_REPORTED = (
    "a server does not report its evicted blocks through the OpenAI API; the reused and "
    "recomputed tokens (from cached_tokens) show the eviction instead"
)


@dataclass(frozen=True)
class Sizing:
    """How the demonstration was sized to the probed cache."""

    capacity: Figure  # the probe's figure, as it reported it
    kind: str  # "tokens" (a paged cache) or "prompts" (whole prompts per slot)
    kept: int  # tokens (kind tokens) or prompts (kind prompts) the cache keeps
    groups: int
    prefix_tokens: int
    sim_pool_tokens: int  # the simulator's pool: the cache as tokens


def _client(server: ServerLLM, requests: int, tokens: int) -> ProbeClient:
    """A client of the server with its own budget (the capacity section must stop) and the
    run's timeout for it; the server answered before, so silence now means it stopped."""
    c = server.client
    client = ProbeClient(c.base_url, c.model, c.api_key, Budget(requests, tokens), c.timeout)
    client.answered = c.answered
    return client


def kept_by(fig: Figure) -> tuple[str, int] | str:
    """("tokens" | "prompts", how many) the cache keeps, or why that is not known."""
    v = fig.value
    if isinstance(v, int) and fig.how == "measured":
        return "tokens", v
    if isinstance(v, str):
        m = re.fullmatch(r"(\d+) prompts", v)
        if m:
            return "prompts", int(m.group(1))
        m = re.fullmatch(r"([\d,]+)-([\d,]+)", v)
        if m:  # a bracket: the cache was lost after the upper end
            return "tokens", int(m.group(2).replace(",", ""))
    return f"the probe could not bound the cache's capacity ({fig.note or fig.shown()})"


def size(session: Session, page: int, fig: Figure, max_len: int) -> Sizing | str:
    """Groups and prefix length that overflow the probed cache, or why none fit."""
    ev = session.cfg.eviction
    found = kept_by(fig)
    if isinstance(found, str):
        return found
    kind, kept = found
    tail = ev.suffix_tokens + ev.output_tokens + 1
    if kind == "prompts":
        groups = max(ev.groups, kept + 2)
        prefix = ev.prefix_tokens
        if prefix + tail > max_len:
            return f"a prefix of {prefix} tokens does not fit the server's {max_len}-token context"
        sim_pool = kept * (prefix + tail)
    else:
        unit = max(1, page)
        longest = (max_len - tail) // unit * unit
        if longest < unit:
            return f"the server's context of {max_len} tokens holds no prefix page"
        groups = ev.groups
        prefix = -(-int(kept / (ev.pool_share * groups)) // unit) * unit
        if prefix > longest:
            groups = -(-int(kept / ev.pool_share) // longest)
            prefix = -(-int(kept / (ev.pool_share * groups)) // unit) * unit
        prefix = max(unit, min(prefix, longest))
        if ev.concurrency * (prefix + tail) > kept:
            return (
                f"{ev.concurrency} running requests of {prefix + tail} tokens do not fit the "
                f"probed cache of {kept:,} tokens"
            )
        sim_pool = kept
    if groups * ev.requests_per_group > MAX_REQUESTS:
        return (
            f"overflowing a cache of {kept:,} {kind} takes {groups} prefix groups "
            f"({groups * ev.requests_per_group} requests per order, more than the "
            f"workshop's {MAX_REQUESTS}); `ctxlab probe` measures the capacity itself"
        )
    return Sizing(fig, kind, kept, groups, prefix, sim_pool)


def profile_design(ev: EvictionSection, prefix: int, slots: int | None) -> steptime.ProfileDesign:
    """Steps shaped like this demonstration's: suffixes, whole requests, decodes of one to
    `concurrency` requests at the requests' length."""
    request = prefix + ev.suffix_tokens
    batches = tuple(sorted({1, ev.concurrency}))
    mixed = ev.concurrency - 1 if ev.concurrency > 1 and (slots is None or slots > 1) else 0
    return steptime.ProfileDesign(
        prefill_lengths=tuple(sorted({ev.suffix_tokens + 8, max(64, request // 2), request})),
        prefill_repeats=2,
        decode_contexts=(request,),
        decode_batches=batches,
        decode_tokens=8,
        mixed_batch=mixed,
        mixed_context=request,
        mixed_prompts=(ev.suffix_tokens + 8, request) if mixed else (),
    )


def sized_session(session: Session, s: Sizing, page: int) -> Session:
    """The session with the eviction section and page the server was sized to (the
    simulator and the job builder of `eviction_workload` read them from there)."""
    from dataclasses import replace

    session.text_ids(0)  # the text loads once, shared by the copy
    ev = session.cfg.eviction.model_copy(
        update={"groups": s.groups, "prefix_tokens": s.prefix_tokens}
    )
    engine = session.cfg.engine.model_copy(update={"page_size": max(1, page)})
    cfg = session.cfg.model_copy(update={"eviction": ev, "engine": engine})
    return replace(session, cfg=cfg)


def run(session: Session, through: ServerRun, demo: Demonstration[BaseModel]) -> DemoResult:
    """`demo` (the eviction demonstration) sized to the server's probed cache."""
    from ctxlab.workshop import eviction_workload as workload
    from ctxlab.workshop.server_demos import not_measurable

    server, page = through.server, through.page
    if page is None:
        return not_measurable(
            demo, "the server's cache granularity was not resolved (demonstration 3's "
            "staircase), so neither the capacity nor the simulator's pages can be set",
        )  # fmt: skip
    info = server.info
    max_len = info.max_model_len or session.cfg.model.max_model_len
    ev = session.cfg.eviction
    res = DemoResult.of(demo, "run", "measured and modeled")
    f = res.figures
    # 1. the cache's capacity, with its own budget
    cap_client = _client(server, CAPACITY_REQUESTS, 200 * max_len)
    try:
        words, rule = calibrate(cap_client, server.info, secrets.randbits(32))
        with Timer() as t_cap:
            cap = capacity.measure(cap_client, words, rule, page, max_len, lambda _m: None)
        sent_cap = cap_client.budget.requests
    except BudgetSpent:
        return not_measurable(demo, "the capacity section's budget ran out")
    finally:
        cap_client.close()
    sizing = size(session, page, cap.capacity, max_len)
    if isinstance(sizing, str):
        return not_measurable(demo, sizing)
    sized = sized_session(session, sizing, page)
    # 2. a step profile shaped like these requests
    design = profile_design(ev, sizing.prefix_tokens, info.slots)
    with Timer() as t_prof:
        prof = steptime.measure(server.client, words, rule, design, lambda _m: None, info.slots)
    if len(prof.steps) < 5:
        return not_measurable(
            demo, f"the server gave {len(prof.steps)} usable profile steps, fewer than "
            "the simulator's 5 (" + "; ".join(prof.missing) + ")",
        )  # fmt: skip
    profile = session.out / "server-step-profile.json"
    doc = steptime.profile_document(
        prof, info.url, info.model, page, sizing.sim_pool_tokens, "workshop eviction"
    )
    profile.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    # 3. the prediction, written before any measured request
    sized_ev = sized.cfg.eviction
    jobs = workload.build_jobs(sized, sized_ev, sized.cfg.engine.page_size)
    unique = sizing.groups * sizing.prefix_tokens + len(jobs) * ev.suffix_tokens
    runs: dict[str, dict[str, dict]] = {o: {} for o in ORDERS}
    for order in ORDERS:
        listed = workload.ordered(jobs, order)
        try:
            sim = workload.run_simulator(
                sized, sized_ev, listed, sizing.sim_pool_tokens, profile
            ).as_dict(unique)
        except CtxlabError as exc:
            raise CtxlabError(f"demonstration 4's simulation failed: {exc}") from None
        runs[order]["simulator"] = sim
    predicted_at = time.time()
    _write_prediction(session.out / "eviction-prediction.json", runs, sizing, predicted_at)
    # 4. the server, both orders (its KV events read meanwhile, when it publishes them)
    listener = _listen(server.kv_events)
    starts: list[float] = []
    try:
        for order in ORDERS:
            starts.append(time.time())
            runs[order]["server"] = send_all(server, workload.ordered(jobs, order), ev)
    finally:
        residency = listener.stop() if listener is not None else None
    events_note = ""
    if listener is not None and residency is not None:
        counted = evictions_from_events(listener, residency, starts)
        if isinstance(counted, str):
            events_note = counted
        else:
            for order, n in zip(ORDERS, counted, strict=True):
                runs[order]["server"]["evictions"] = n
            events_note = _events_sentence(listener, residency)
    for order in ORDERS:
        for side in runs[order].values():
            side["computed"] = side["queried"] - side["reused"]
            side["recomputed"] = side["computed"] - unique
            for q in (50, 95, 99):
                side[f"ttft_p{q}"] = pct(side["ttft_ms"], q)
    label = through.label
    _tables(session, res, runs, sizing, page, sent_cap, t_cap.wall_s, t_prof.wall_s, label)
    _observe(res, runs, events_note)
    _explain(session, res, runs, sizing, unique, label, events_note)
    lead_ms = 1e3 * (runs["grouped"]["server"]["started"] - predicted_at)
    res.notes.append(
        "The simulator's prediction was computed from the probed profile and written to "
        "eviction-prediction.json before the first measured request was sent "
        f"({f.say('prediction_lead_ms', lead_ms, 1)} ms before)."
    )
    return res


def _write_prediction(path: Path, runs: dict, s: Sizing, at: float) -> None:
    doc = {
        "written_at_unix_s": at,
        "groups": s.groups,
        "prefix_tokens": s.prefix_tokens,
        "simulator_pool_tokens": s.sim_pool_tokens,
        "capacity": s.capacity.as_dict(),
        "predicted": {
            o: {k: v for k, v in r["simulator"].items() if k != "cpu_s"} for o, r in runs.items()
        },
    }
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def send_all(server: ServerLLM, jobs: list, ev: EvictionSection) -> dict:
    """Every job arrives at once; at most `concurrency` in flight, in list order."""
    start = time.perf_counter()
    started = time.time()

    def one(job: Any) -> Any:
        ids = server.relabel(job.ids)
        return server.client.complete(ids, len(ids), max_tokens=ev.output_tokens, ignore_eos=True)

    with ThreadPoolExecutor(ev.concurrency) as pool:
        answers = list(pool.map(one, jobs))
    end = max((a.chunk_times[-1] if a.chunk_times else a.sent_at + a.ttft) for a in answers)
    return {
        "reused": sum(a.cached_tokens or 0 for a in answers),
        "queried": sum(a.prompt_tokens for a in answers),
        "hit_requests": sum(1 for a in answers if (a.cached_tokens or 0) > 0),
        "evictions": None,
        "preemptions": None,
        "ttft_ms": [(a.sent_at + a.ttft - start) * 1e3 for a in answers],
        "makespan_s": end - start,
        "peak_running": ev.concurrency,
        "started": started,
        "cached_source": answers[0].cached_source if answers else "",
    }


def _listen(endpoint: str | None) -> EventListener | None:
    """A listener on the server's KV events, subscribed before the first measured request."""
    if endpoint is None:
        return None
    from ctxlab.probe.events import EventListener

    listener = EventListener(endpoint).start()
    time.sleep(SUBSCRIBE_S)  # a ZMQ subscription reaches the publisher a moment later
    return listener


def evictions_from_events(
    listener: EventListener, res: Residency, starts: list[float]
) -> list[int] | str:
    """Blocks of each order evicted while it ran (from its start to the next one's, the last
    to the end of listening: the publisher stamps a batch when the step that made it ends), or
    why the events cannot say (none arrived, or batches were missed).

    Only blocks stored in the same window count: each order starts on a pool the earlier
    work (the capacity fill, the profile, the other order) left full, and the removal of
    those older blocks is room being made, not this order's eviction; the simulator, which
    starts each order on an empty pool, counts the same thing. Counting every removal in the
    window added about one pool to each order."""
    sub = listener.subscriber
    if sub.received_batches == 0:
        return (
            f"no KV events arrived from {listener.endpoint} while the orders ran: is it the "
            "server's publisher (vLLM: --kv-events-config with publisher zmq)?"
        )
    missing = sum(g.missing for g in sub.gaps)
    if missing or sub.dropped_events:
        return (
            f"{missing} batches of the KV events from {listener.endpoint} were missed and "
            f"{sub.dropped_events} events let go, so a count of evicted blocks would be short"
        )
    bounds = [*starts[1:], float("inf")]
    return [
        sum(
            1
            for e in res.evictions
            if start <= e.at < end and e.lifetime_s is not None and e.at - e.lifetime_s >= start
        )
        for start, end in zip(starts, bounds, strict=True)
    ]


def _events_sentence(listener: EventListener, res: Residency) -> str:
    return (
        f"counted from the server's KV events ({listener.endpoint}: "
        f"{listener.subscriber.received_batches:,} batches, no gap; BlockRemoved of "
        f"{res.block_size}-token blocks)"
    )


def _tables(
    session: Session,
    res: DemoResult,
    runs: dict,
    s: Sizing,
    page: int,
    sent_cap: int,
    cap_s: float,
    prof_s: float,
    label: str,
) -> None:
    ev = session.cfg.eviction
    f = res.figures
    n = len(runs["grouped"]["server"]["ttft_ms"])
    cache = (
        f"{f.say('capacity_kept', s.kept)} {s.kind}"
        + (f" (the simulator: {f.say('sim_pool_tokens', s.sim_pool_tokens)} tokens)"
           if s.kind == "prompts" else "")
    )  # fmt: skip
    storage = Table(
        "eviction_server_storage", "storage",
        f"Demonstration 4: {f.say('groups', s.groups)} prefixes of "
        f"{f.say('prefix_tokens', s.prefix_tokens)} tokens against a cache that keeps {cache} "
        f"on {label}",
        "measured and modeled",
        [Column("arrivals"), Column("side"), Column("reused tokens"),
         Column("computed prompt tokens"), Column("recomputed tokens"), Column("hit requests"),
         Column("evicted blocks")],
        note="server rows: usage cached_tokens of each request (measured), evicted blocks from "
        "the server's KV events (BlockRemoved) where its [[servers]] entry names kv_events, "
        "else n/a; simulator rows: predicted from the probed profile, page and capacity before "
        "the server was measured; recomputed = computed prompt tokens minus tokens no earlier "
        "request had computed",
    )  # fmt: skip
    serving = Table(
        "eviction_server_serving", "serving",
        f"Demonstration 4: TTFT when all {f.say('requests', n)} requests arrive together, at "
        f"most {f.say('concurrency', ev.concurrency)} in flight, on {label}",
        "measured and modeled",
        [Column("arrivals"), Column("side"), Column("TTFT p50 ms", 1), Column("TTFT p95 ms", 1),
         Column("TTFT p99 ms", 1), Column("makespan s", 2)],
        note="TTFT from the common start (the client-side queue included, as in the "
        "simulator); simulator step times: the server's profile probed from outside",
    )  # fmt: skip
    for order in ORDERS:
        for side in ("server", "simulator"):
            r = runs[order][side]
            storage.add(order, side, r["reused"], r["computed"], r["recomputed"],
                        r["hit_requests"], r["evictions"])  # fmt: skip
            serving.add(order, side, r["ttft_p50"], r["ttft_p95"], r["ttft_p99"], r["makespan_s"])
    probe = Table(
        "eviction_server_probe", "storage",
        f"Demonstration 4: what the sizing read from {label}", "measured",
        [Column("figure"), Column("value"), Column("how")],
        note="capacity: `ctxlab.probe.capacity` (fill until the cache evicts); profile: "
        "`ctxlab.probe.steptime` with steps shaped like these requests",
    )  # fmt: skip
    probe.add("cache granularity (tokens)", page, "measured (demonstration 3's staircase)")
    probe.add("prefix-cache capacity", s.capacity.shown(), s.capacity.how)
    probe.add("capacity requests sent", sent_cap, "measured")
    probe.add("capacity seconds", round(cap_s, 1), "measured")
    probe.add("profile seconds", round(prof_s, 1), "measured")
    res.tables += [probe, storage, serving]


def _observe(res: DemoResult, runs: dict, events_note: str) -> None:
    g, i = runs["grouped"]["server"], runs["interleaved"]["server"]
    si = runs["interleaved"]["simulator"]
    res.observe("reused_tokens", g["reused"], i["reused"])
    res.observe("recomputed_tokens", g["recomputed"], i["recomputed"])
    counted = i["evictions"] is not None
    why = None if counted else (events_note or NOT_REPORTED)
    res.observe("evictions", g["evictions"], i["evictions"], why_missing=why)
    res.observe_latency("ttft_p50_ms", g["ttft_ms"], i["ttft_ms"], 1)
    for q in (95, 99):
        res.observe(f"ttft_p{q}_ms", g[f"ttft_p{q}"], i[f"ttft_p{q}"], 1)
    res.observe("sim_vs_engine_reused_tokens", i["reused"], si["reused"])
    if counted:
        res.observe("sim_vs_engine_evictions", i["evictions"], si["evictions"])
    else:
        res.observe("sim_vs_engine_evictions", None, None, why_missing=why)
    # the prediction against the server's TTFTs: a bootstrap of the difference of medians
    res.observe_latency("sim_vs_engine_ttft_p50_ms", i["ttft_ms"], si["ttft_ms"], 1)


def _explain(
    session: Session,
    res: DemoResult,
    runs: dict,
    s: Sizing,
    unique: int,
    label: str,
    events_note: str = "",
) -> None:
    f = res.figures
    g, i = runs["grouped"]["server"], runs["interleaved"]["server"]
    sg, si = runs["grouped"]["simulator"], runs["interleaved"]["simulator"]
    res.summary = (
        f"Sized from the probed cache of {label}: {f.say('groups', s.groups)} prefix groups of "
        f"{f.say('prefix_tokens', s.prefix_tokens)} tokens, more than the cache keeps, so the "
        "interleaved order must evict; the simulator predicted both orders from the probed "
        "profile before the server ran them."
    )
    res.gains.append(
        Gain(
            "grouped arrivals against interleaved ones (on the server)",
            f"grouped, the server reused {f.say('reused_grouped', g['reused'])} prompt tokens; "
            f"interleaved, {f.say('reused_interleaved', i['reused'])}: "
            f"{f.say('recomputed_interleaved', i['recomputed'])} tokens an earlier request had "
            f"computed were computed again (grouped: "
            f"{f.say('recomputed_grouped', g['recomputed'])})",
            f"p50 TTFT {f.say('ttft_p50_grouped', g['ttft_p50'], 1)} ms grouped against "
            f"{f.say('ttft_p50_interleaved', i['ttft_p50'], 1)} ms interleaved; the whole list "
            f"took {f.say('makespan_grouped', g['makespan_s'], 2)} s against "
            f"{f.say('makespan_interleaved', i['makespan_s'], 2)} s",
        )
    )
    res.gains.append(
        Gain(
            "predicting the server without running it (simulator, probed profile)",
            f"the simulator predicted {f.say('sim_reused_interleaved', si['reused'])} reused "
            f"tokens interleaved and {f.say('sim_reused_grouped', sg['reused'])} grouped",
            f"it predicted p50 TTFT {f.say('sim_ttft_p50_interleaved', si['ttft_p50'], 1)} ms "
            f"interleaved and {f.say('sim_ttft_p50_grouped', sg['ttft_p50'], 1)} ms grouped",
        )
    )
    if s.kind == "prompts":
        res.notes.append(
            "This server keeps whole prompts per slot, not shared pages; the simulator models "
            "it as a paged LRU cache holding as many tokens as those prompts, so its reuse "
            "prediction is a model of a different kind of cache and may miss for that reason."
        )
    if i["evictions"] is not None:
        res.notes.append(
            f"Evicted blocks: {f.say('evictions_grouped', g['evictions'])} grouped and "
            f"{f.say('evictions_interleaved', i['evictions'])} interleaved, {events_note}; the "
            f"simulator predicted {f.say('sim_evictions_interleaved', si['evictions'])} "
            f"interleaved and {f.say('sim_evictions_grouped', sg['evictions'])} grouped."
        )
    else:
        res.notes.append(f"Evicted blocks: not measurable ({events_note or NOT_REPORTED}).")
