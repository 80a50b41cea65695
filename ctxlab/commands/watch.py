"""`ctxlab watch ENDPOINT`: subscribe to a server's KV events and write measured residency.

The endpoint is vLLM's `--kv-events-config` publisher or `ctxlab serve
--kv-events-endpoint`, on this machine. For `--seconds` it reads every batch (a sequence
gap is reported, and filled from `--replay` when given), then writes `residency.json`
(timeline, lifetimes, evictions in order, reuse gaps, capacity from the first removal, and
for each request of `--requests` why it hit or missed) and `residency.png`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ctxlab.commands.options import JsonOpt, input_file, output_dir
from ctxlab.errors import CtxlabError
from ctxlab.json_output import dumps


def watch(
    endpoint: str = typer.Argument(
        ..., help="The publisher's ZMQ endpoint on this machine, e.g. tcp://127.0.0.1:5557."
    ),
    seconds: float = typer.Option(30.0, "--seconds", help="How long to listen."),
    out: Path = typer.Option(Path("watch-out"), "--out", help="Folder for the results."),
    replay: str = typer.Option(
        None,
        "--replay",
        help="The publisher's replay endpoint: batches sent before the watch began (all it "
        "still holds) and any missed on the way are asked for there.",
    ),
    topic: str = typer.Option("", "--topic", help="The publisher's topic (vLLM's default: '')."),
    requests: Path = typer.Option(
        None,
        "--requests",
        help='JSON lines {"at": epoch seconds, "token_ids": [...], "salt": null} to explain: '
        "hit, shorter than one block, another salt, evicted at t, or never stored.",
    ),
    max_events: int = typer.Option(
        200_000, "--max-events", help="Events kept in memory (the oldest go first)."
    ),
    as_json: JsonOpt = False,
) -> None:
    """Watch a server's KV cache through its KV events (vLLM's format): blocks resident over
    time, lifetimes, evictions in order, and why requests missed."""
    import math

    from ctxlab.kvevents.events import msgpack_module
    from ctxlab.kvevents.subscriber import check_loopback, zmq_module

    if not (math.isfinite(seconds) and seconds > 0):
        raise CtxlabError(f"--seconds must be a positive number, got {seconds}.")
    if max_events < 1:
        raise CtxlabError(f"--max-events must be at least 1, got {max_events}.")
    check_loopback(endpoint, "the endpoint")
    if replay is not None:
        check_loopback(replay, "--replay")
    msgpack_module()
    zmq_module()
    from ctxlab.kvevents.requests import read_requests

    asked = read_requests(input_file(requests, "--requests")) if requests is not None else []
    folder = output_dir(out)

    from ctxlab.kvevents.plot import plot_residency
    from ctxlab.kvevents.residency import Residency, hash_text
    from ctxlab.kvevents.subscriber import Subscriber
    from ctxlab.outputs import write_text
    from ctxlab.progress import progress

    with Subscriber(
        endpoint, topic, replay, max_events, expect_from=0 if replay is not None else None
    ) as sub:
        import time

        sub.catch_up()  # with --replay: what the publisher sent before this watch began

        end = time.monotonic() + seconds
        with progress(f"watching {endpoint} for {seconds:g} s", enabled=not as_json) as bar:
            while (left := end - time.monotonic()) > 0:
                bar.advance(sub.poll(min(left, 0.5)))
    res = Residency(max_records=max_events).feed_all(r.batch for r in sub.batches)
    misses = [res.explain(q) for q in asked]
    doc = {
        "endpoint": endpoint,
        "seconds": seconds,
        "batches": sub.received_batches,
        "events_kept": sub.n_events,
        "events_dropped": sub.dropped_events,
        "unknown_events": sub.unknown_events,
        "bad_messages": sub.bad_messages,
        "gaps": [
            {"first": g.first, "last": g.last, "replayed": g.replayed, "missing": g.missing}
            for g in sub.gaps
        ],
        **res.to_json(),
        "requests": [
            {
                "at": m.at,
                "prompt_tokens": m.prompt_tokens,
                "hit_blocks": m.hit_blocks,
                "shareable_blocks": m.shareable_blocks,
                "reason": m.reason,
                "evicted_at": m.evicted_at,
            }
            for m in misses
        ],
        "resident_now": [hash_text(h) for h in list(res.resident)[:max_events]],
    }
    write_text(folder / "residency.json", dumps(doc, indent=2) + "\n", "--out")
    plot_residency(res, folder / "residency.png", f"KV events from {endpoint}")
    if as_json:
        typer.echo(dumps(doc, indent=2))
    else:
        _table(doc, res.summary(), folder)
    if sub.received_batches == 0:
        raise CtxlabError(
            f"no KV events arrived from {endpoint} in {seconds:g} s: is a publisher there "
            "(vLLM: --kv-events-config with publisher zmq; ctxlab serve: --kv-events-endpoint)?"
        )


def _table(doc: dict[str, object], summary: dict[str, object], folder: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"KV residency, measured from events ({doc['endpoint']})")
    table.add_column("measure", style="bold")
    table.add_column("value", justify="right")

    def row(name: str, value: object) -> None:
        if isinstance(value, float):
            value = f"{value:.3f}"
        table.add_row(
            name, "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)
        )

    row("batches read", doc["batches"])
    gaps = doc["gaps"]
    assert isinstance(gaps, list)
    row("sequence gaps (batches still missing)", f"{len(gaps)} ({sum(g['missing'] for g in gaps)})")
    row("block size (tokens)", summary["block_size"])
    row("blocks stored", summary["stored_blocks"])
    row("blocks removed (evictions)", summary["evictions"])
    row(
        "resident now / peak",
        f"{summary['resident_blocks']:,} / {summary['peak_resident_blocks']:,}",
    )
    first = summary["first_eviction"]
    at_first = first.get("resident_blocks") if isinstance(first, dict) else None
    row("resident at the first removal (blocks)", at_first)
    row("most tokens cached at once, pool full", summary["capacity_tokens"])
    row("median block lifetime (s)", summary["median_lifetime_s"])
    row("reuse gaps (removed, stored again)", summary["reuse_gaps"])
    row("median reuse gap (s)", summary["median_reuse_gap_s"])
    row("events dropped (memory cap)", doc["events_dropped"])
    reqs = doc["requests"]
    assert isinstance(reqs, list)
    if reqs:
        counts: dict[str, int] = {}
        for r in reqs:
            counts[r["reason"]] = counts.get(r["reason"], 0) + 1
        row("requests explained", ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    table.caption = f"written: {folder / 'residency.json'}, {folder / 'residency.png'}"
    Console(width=120).print(table)


def register(app: typer.Typer) -> None:
    app.command("watch")(watch)
