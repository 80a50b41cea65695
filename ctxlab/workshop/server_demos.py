"""What `ctxlab workshop --server` measures for the demonstrations that need the engine
itself (each declares these in its `ServerMode`; nothing here is chosen by key).

- `page_size` (the page-size demonstration's variant): a server's page size cannot be changed
  from outside, so the run measures it instead: the probe's divergence staircase
  (`ctxlab.probe.prefix`) gives the server's reuse granularity, each divergence point's
  reused and recomputed tokens, and the rounding waste the granularity implies for the
  config's request lengths; with several servers, their pages side by side.
- `workload_rows` (the recurrent demonstration's extra): its measured short and long
  workloads sent to the server as well.
- The eviction demonstration's variant is sized to the server's probed cache
  (`server_eviction.py`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ctxlab.workshop.result import Column, DemoResult, Table
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ctxlab.workshop.config import Workload
    from ctxlab.workshop.demonstration import Demonstration
    from ctxlab.workshop.server_findings import ServerRun


def not_measurable(demo: Demonstration[BaseModel], reason: str) -> DemoResult:
    res = DemoResult.of(demo, "not measurable")
    res.summary = f"Not measurable through the server: {reason}."
    res.notes.append(res.summary)
    return res


def page_size(
    session: Session, run: ServerRun, demo: Demonstration[BaseModel], request_tokens: list[int]
) -> DemoResult:
    """`demo` (the page-size demonstration) through a server: its page measured instead."""
    server, pre = run.server, run.staircase
    assert pre is not None  # a run whose staircase failed ran no demonstration
    # Its predictions compare page sizes, which a server does not let a client choose: the
    # demonstration as configured is not measurable; what the server's page is, is.
    res = DemoResult.of(demo, "not measurable")
    g = pre.granularity
    page = g.value if isinstance(g.value, int) else None
    f = res.figures
    shown = (
        f"{f.say('server_page_tokens', page)} token(s)" if page else "not resolved"
    )  # fmt: skip
    points = f.say("divergence_points", len(pre.points))
    label = server.label(code=True)
    reuse = Table(
        "page_size_server_reuse", "storage",
        f"Demonstration 3: reuse after a divergence on {label}", "measured",
        [Column("diverges at token"), Column("prompt tokens"), Column("reused tokens"),
         Column("recomputed tokens")],
        note=f"reuse granularity {shown} ({g.how}), from {points} divergence points",
    )  # fmt: skip
    for p in pre.points:
        reuse.add(p["position"], p["prompt_tokens"], p["cached"], p["prompt_tokens"] - p["cached"])
    res.tables.append(reuse)
    if page:
        waste = Table(
            "page_size_server_waste", "storage",
            f"Demonstration 3: rounding the server's pages of {page} tokens implies ({label})",
            "measured",
            [Column("request tokens"), Column("slots allocated"), Column("waste %", 1)],
            note="slots = ceil(tokens / page) x page; the page size is the probed one",
        )  # fmt: skip
        for n in request_tokens:
            slots = math.ceil(n / page) * page
            waste.add(n, slots, 100 * (slots - n) / slots)
        res.tables.append(waste)
    reuse_rule = "d tokens" if page == 1 else f"floor(d / {page}) x {page} tokens"
    res.summary = (
        "Not measurable as configured: the comparison of page sizes needs pages a client "
        f"cannot set on a server. Measured instead: the server's reuse granularity is "
        f"{shown} ({g.how}); a prompt that diverges at token d reuses "
        + (reuse_rule if page else "an amount the staircase did not resolve")
        + " (tables above, in the storage results)."
    )
    res.notes.append(res.summary)
    if len(run.summaries) > 1:
        from ctxlab.workshop.server_compare import page_tables

        res.tables += page_tables(run.summaries, request_tokens)
    return res


def workload_rows(
    session: Session, run: ServerRun, res: DemoResult, workloads: list[tuple[str, Workload]]
) -> None:
    """The recurrent demonstration's measured short and long workloads, sent to the server as
    well (the modeled recurrent side needs no server): every request at once, fresh
    prompts; a table of `res`'s number and key."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from ctxlab.probe.running import INTERVAL_S, RunningSampler
    from ctxlab.workshop.measure import pct

    server = run.server
    label = server.label(code=True)
    why = (
        "not measurable: the server publishes no running-requests gauge in /metrics (vLLM's "
        "num_requests_running, SGLang's num_running_reqs, llama.cpp's requests_processing)"
    )
    table = Table(
        f"{res.key}_server", "serving",
        f"Demonstration {res.number}: the short and long workloads on {label}", "measured",
        [Column("workload"), Column("requests"), Column("tokens per request"),
         Column("TTFT p50 ms", 1), Column("TTFT p99 ms", 1), Column("makespan s", 2),
         Column("concurrency reached")],
        note="every request sent at once (fresh prompts, nothing shared); TTFT from the "
        "common start; concurrency reached is the largest value of the server's own "
        f"running-requests gauge, read from /metrics every {INTERVAL_S * 1e3:.0f} ms while "
        "the workload ran (a lower bound: a batch shorter than that can be missed; the gauge "
        "counts every client's requests, so another client's traffic would add to it); the "
        "resident bytes per request are not visible through the API",
    )  # fmt: skip
    f = res.figures
    for name, w in workloads:
        prompts = [session.text_ids(w.input_tokens) for _ in range(w.requests)]
        start = time.perf_counter()

        def one(ids: list[int], out: int = w.output_tokens, t0: float = start) -> tuple:
            rotated = server.relabel(ids)
            a = server.client.complete(rotated, len(ids), max_tokens=out, ignore_eos=True)
            end = a.chunk_times[-1] if a.chunk_times else a.sent_at + a.ttft
            return (a.sent_at + a.ttft - t0) * 1e3, end - t0

        with (
            RunningSampler(server.client) as running,
            ThreadPoolExecutor(min(PARALLEL_MAX, w.requests)) as pool,
        ):
            got = list(pool.map(one, prompts))
        ttft = [g[0] for g in got]
        reached = why if running.peak is None else int(running.peak)
        table.add(name, w.requests, w.input_tokens + w.output_tokens, pct(ttft, 50),
                  pct(ttft, 99), max(g[1] for g in got), reached)  # fmt: skip
        f.say(f"server_{name}_ttft_p99_ms", pct(ttft, 99), 1)
    res.tables.append(table)


PARALLEL_MAX = 64
