"""Human output of a plan: one rich table per section, rendered from `build_plan`'s dict.

Tables read the dict rather than recomputing anything, so what a person reads is exactly
what `--json` and the web lab return. Binary byte units are labelled (GiB), decimal GB
appears only where labelled.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from ctxlab.plan.units import fmt_bytes, fmt_flops, fmt_gb, fmt_seconds, fmt_tokens


def _table(plan: dict[str, Any], name: str, columns: list[str]) -> Table:
    section = plan["sections"][name]
    table = Table(
        title=f"{section['title']}  [dim](layer: {section['layer']})[/dim]",
        title_justify="left",
    )
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 or col == "in words" else "right")
    return table


def _kinds(by_kind: dict[str, int]) -> str:
    return ", ".join(f"{kind}: {fmt_bytes(n)}" for kind, n in by_kind.items()) or "-"


def _money(x: float | None, currency: str) -> str:
    return "-" if x is None else f"{x:.4g} {currency}"


def _context(plan: dict[str, Any], i: int) -> str:
    """A context length, marked * when it is beyond the model's trained length."""
    row = plan["sections"]["memory"]["rows"][i]
    mark = " *" if row.get("beyond_trained_length") else ""
    return fmt_tokens(row["context_tokens"]) + mark


def header_lines(plan: dict[str, Any]) -> list[str]:
    arch, device, inputs = plan["arch"], plan["device"], plan["inputs"]
    kinds = ", ".join(f"{n} x {k}" for k, n in arch["layer_kinds"].items())
    dtype = inputs["cache_dtype"] or f"{arch['cache_dtype_bytes']:g} bytes/element"
    trained = arch.get("trained_length") or 0
    chosen = inputs.get("gpus_source", "given")
    gpus = ""
    if inputs["gpus"] > 1:
        gpus = (
            " (tensor parallel, chosen to hold the weights plus the reserve: see the notes)"
            if chosen != "given"
            else " (tensor parallel)"
        )
    return [
        f"[bold]{arch['name']}[/bold]: {arch['n_layers']} layers ({kinds}); "
        f"{arch['params']:,} parameters"
        + (f", trained to {trained:,} tokens" if trained else "")
        + f"; cache dtype {dtype}",
        f"weights {fmt_bytes(inputs['weights_bytes'])} "
        f"({inputs.get('weights_source', 'given')}), reserve {fmt_bytes(inputs['reserve_bytes'])}",
        f"device {device['name']}{gpus}: {device['peak_flops'] / 1e12:,.0f} TFLOP/s, "
        f"{device['mem_bandwidth'] / 1e12:,.2f} TB/s, {fmt_bytes(device['memory_bytes'])}",
        f"concurrency {inputs['concurrency']}, page size {inputs['page_size']}, "
        f"shared prefix {inputs['shared_prefix_tokens']:,} tokens, "
        f"{inputs['output_tokens']:,} output tokens",
    ]


def section_tables(plan: dict[str, Any]) -> list[Table]:
    """One table per section, in the order of the stack."""
    n = plan["inputs"]["concurrency"]
    tables: list[Table] = []
    mem = plan["sections"]["memory"]
    t = _table(plan, "memory", ["context", "per request", "by layer kind", f"x {n} requests"])
    t.caption = (
        f"{fmt_bytes(mem['summary']['kv_bytes_per_token'])} "
        f"({mem['summary']['kv_bytes_per_token']:,} B) per token"
        + (
            f"; plus {fmt_bytes(mem['summary']['fixed_state_bytes_per_request'])} fixed state "
            "per request"
            if mem["summary"]["fixed_state_bytes_per_request"]
            else ""
        )
        + (
            f"; stops growing at {mem['summary']['growth_stops_at_tokens']:,} tokens"
            if mem["summary"]["growth_stops_at_tokens"] is not None
            else ""
        )
    )
    for i, r in enumerate(mem["rows"]):
        t.add_row(
            _context(plan, i),
            f"{fmt_bytes(r['kv_bytes_per_request'])} ({fmt_gb(r['kv_bytes_per_request'])})",
            _kinds(r["kv_bytes_per_request_by_kind"]),
            fmt_bytes(r["kv_bytes_for_concurrency"]),
        )
    tables.append(t)

    page = plan["sections"]["paging"]
    t = _table(
        plan,
        "paging",
        ["context", "allocated slots", "wasted slots", "allocated bytes", "wasted bytes"],
    )
    t.caption = f"pages of {page['summary']['page_size']} tokens: ceil(tokens / P) x P slots"
    for i, r in enumerate(page["rows"]):
        t.add_row(
            _context(plan, i),
            fmt_tokens(r["allocated_tokens_per_request"]),
            fmt_tokens(r["wasted_tokens_per_request"]),
            fmt_bytes(r["allocated_bytes_per_request"]),
            fmt_bytes(r["wasted_bytes_per_request"]),
        )
    tables.append(t)

    share = plan["sections"]["sharing"]
    t = _table(
        plan,
        "sharing",
        ["context", "prefix shared", "without sharing", "avoided", "with sharing", "full pages"],
    )
    t.caption = (
        f"{share['summary']['requests']} requests sharing "
        f"{share['summary']['shared_prefix_tokens']:,} prefix tokens; avoided = (N - 1) x "
        "prefix bytes still resident; 'full pages' shares whole pages only"
    )
    for i, r in enumerate(share["rows"]):
        t.add_row(
            _context(plan, i),
            fmt_tokens(r["prefix_tokens_shared"]),
            fmt_bytes(r["bytes_without_sharing"]),
            fmt_bytes(r["bytes_avoided_by_sharing"]),
            fmt_bytes(r["bytes_with_sharing"]),
            fmt_bytes(r["bytes_avoided_full_pages"]),
        )
    tables.append(t)

    cap = plan["sections"]["capacity"]
    s = cap["summary"]
    t = _table(plan, "capacity", ["context", "max requests", f"{n} fit?", "in words"])
    t.caption = (
        f"KV budget {fmt_bytes(s['kv_budget_bytes'])} = "
        f"device {fmt_bytes(s['device_memory_bytes'])}"
        f" - weights {fmt_bytes(s['weights_bytes'])} - reserve {fmt_bytes(s['reserve_bytes'])}"
        f"; a request counts its context plus {plan['inputs']['output_tokens']:,} generated "
        "tokens"
    )
    for i, r in enumerate(cap["rows"]):
        fits = r["max_concurrent_requests"]
        t.add_row(
            _context(plan, i),
            "unbounded" if fits is None else f"{fits:,}",
            "yes" if r["concurrency_fits"] else "no",
            r["capacity_sentence"],
        )
    tables.append(t)

    comp = plan["sections"]["compute"]
    device = comp["summary"]["device"]
    t = _table(plan, "compute", ["context", "FLOPs", "weights", "attention", "attn share", "time"])
    t.title = f"Prefill at roofline on {device}  [dim](layer: compute)[/dim]"
    t.caption = "2 x active params x tokens + causal attention; time at peak FLOP/s (lower bound)"
    for i, r in enumerate(comp["rows"]):
        t.add_row(
            _context(plan, i),
            fmt_flops(r["prefill_flops"]),
            fmt_flops(r["prefill_weight_flops"]),
            fmt_flops(r["prefill_attention_flops"]),
            f"{r['attention_flops_share']:.1%}",
            fmt_seconds(r["prefill_seconds"]),
        )
    tables.append(t)
    t = _table(
        plan, "compute", ["context", "weights read", "cache read", "bytes/step", "time/token"]
    )
    t.title = f"Decode at roofline on {device}  [dim](layer: compute)[/dim]"
    t.caption = "one request alone"
    if n > 1:
        t.caption += f"; a step of all {n} together takes " + ", ".join(
            f"{fmt_seconds(r['decode_batch_seconds_per_step'])} at "
            f"{fmt_tokens(r['context_tokens'])}"
            for r in comp["rows"]
        )
        t.caption += " tokens"
    for i, r in enumerate(comp["rows"]):
        t.add_row(
            _context(plan, i),
            fmt_bytes(r["decode_weight_bytes_per_step"]),
            fmt_bytes(r["decode_cache_bytes_per_step"]),
            fmt_bytes(r["decode_bytes_per_step"]),
            fmt_seconds(r["decode_seconds_per_token"]),
        )
    tables.append(t)

    if "cost" in plan["sections"]:
        tables += _cost_tables(plan)
    return tables


def _cost_tables(plan: dict[str, Any]) -> list[Table]:
    """Hosted cost per request at its length tier, then the self-hosted bill term by term."""
    c = plan["sections"]["cost"]
    cur = c["summary"].get("currency", "USD")
    card = c["summary"].get("rate_card")
    t = _table(
        plan,
        "cost",
        [
            "context",
            "tier",
            "hosted (cold)",
            "hosted (warm)",
            "self-hosted GPU time",
            "per success",
            "per 1M tokens",
        ],
    )
    t.caption = (
        "per request, in "
        f"{cur}; tier: the length tier the whole prompt falls in; cold: the shared prefix is "
        "written to the provider cache; warm: it is read back; per success: self-hosted cost "
        "of one successful request; per 1M tokens: per token any request processed"
    )
    if card and card["date"] != "not given":
        t.caption += (
            f"; rate card {card['name']}, {card['date']}, {card['region']}, tier "
            f"{card['tier']} ({card['source']})"
        )
    for i, r in enumerate(c["rows"]):
        gpu = r["self_hosted_gpu_seconds"]
        per_token = r["self_hosted_cost_per_token"]
        t.add_row(
            _context(plan, i),
            (r["hosted_tier"] or "-").removesuffix(" tokens"),
            _money(r["hosted_cold_cost"], cur),
            _money(r["hosted_warm_cost"], cur),
            "-" if gpu is None else fmt_seconds(gpu),
            _money(r["self_hosted_cost_per_success"], cur),
            _money(None if per_token is None else per_token * 1e6, cur),
        )
    tables = [t]
    if c["summary"].get("self_hosted") is None:
        return tables
    t = Table(title="Self-hosted bill of the run  [dim](layer: cost)[/dim]", title_justify="left")
    columns = ["context", "device", "CPU", "network", "storage", "idle reserve", "total"]
    for i, col in enumerate([*columns, "ok / failed / cancelled"]):
        t.add_column(col, justify="left" if i == 0 else "right")
    for i, r in enumerate(c["rows"]):
        terms, n = r["self_hosted_cost_terms"], r["self_hosted_requests"]
        t.add_row(
            _context(plan, i),
            *(_money(terms[k], cur) for k in ("device", "cpu", "network", "storage")),
            _money(terms["idle_reserve"], cur),
            _money(r["self_hosted_total_cost"], cur),
            f"{n['succeeded']:,}/{n['failed']:,}/{n['cancelled']:,}",
        )
    t.caption = (
        "every term of the storage formula, over every request of the run, failed and "
        "cancelled ones included; divided by the successes it is the cost per success"
    )
    tables.append(t)
    return tables


def engine_tables(engine: dict[str, Any]) -> list[Table]:
    """The engine's pool beside the ideal, then its KV cache groups."""
    mml = engine["max_model_len"]
    t = Table(
        title=f"What {engine['title']} allocates  [dim](layer: allocation; {engine['basis']})"
        "[/dim]",
        title_justify="left",
    )
    for col in ("figure", engine["title"], "ideal"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    blocks = engine["num_blocks"]
    t.add_row("KV pool per rank", fmt_bytes(engine["pool_bytes"]), fmt_bytes(engine["pool_bytes"]))
    t.add_row("block size (tokens)", f"{engine['block_size']:,}", "-")
    if blocks is not None:
        t.add_row("bytes per block", f"{engine['bytes_per_block']:,}", "-")
        t.add_row("blocks in the pool", f"{blocks:,}", "-")
        t.add_row("blocks per request", f"{engine['blocks_per_request']:,}", "-")
    t.add_row(
        f"bytes per request of {mml:,} tokens",
        fmt_bytes(engine["bytes_per_request"]),
        fmt_bytes(engine["ideal_bytes_per_request"]),
    )
    ideal = engine["ideal_concurrency"]
    t.add_row(
        "max concurrency",
        f"{engine['max_concurrency']:.2f}x",
        "-" if ideal is None else f"{ideal:.2f}x",
    )
    ideal_n = engine["ideal_requests"]
    t.add_row(
        "requests at once",
        f"{engine['requests']:,}",
        "unbounded" if ideal_n is None else f"{ideal_n:,}",
    )
    t.caption = (
        f"{engine['version']}; max_model_len {mml:,} ({engine['max_model_len_source']}); "
        f"pool: {engine['pool_source']}; it logs: {engine['log_line']}"
    )
    g = Table(title=f"{engine['title']} KV cache groups", title_justify="left")
    for col in ("group", "layers", "block", "bytes per block", "blocks per request", "rule"):
        g.add_column(col, justify="left" if col in ("group", "layers", "rule") else "right")
    for group in engine["groups"]:
        layers = group["layers"]
        shown = ", ".join(map(str, layers[:8])) + (", ..." if len(layers) > 8 else "")
        g.add_row(
            group["kind"],
            f"{len(layers)}: {shown}",
            f"{group['block_size']:,}",
            f"{group['block_bytes']:,}",
            f"{group['blocks_per_request']:,}",
            group["rule"],
        )
    return [t, g]


def print_plan(plan: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    for line in header_lines(plan):
        console.print(line)
    for table in section_tables(plan):
        console.print(table)
    engine = plan.get("engine")
    if engine:
        for table in engine_tables(engine):
            console.print(table)
        console.print(f"{engine['title']}'s figures are {engine['basis']}.")
        console.print(engine["storage_sentence"])
        console.print(engine["product_sentence"])
        for note in engine["notes"]:
            console.print(f"[dim]engine note: {note}[/dim]")
        sources = sorted(
            {part.split(":")[0] for r in engine["rules"] for part in r["source"].split("; ")}
        )
        console.print(
            f"[dim]engine rules ({len(engine['rules'])}, each with its source in --json under "
            f"engine.rules) read from: {', '.join(sources)}[/dim]"
        )
    for note in plan["notes"]:
        console.print(f"[dim]note: {note}[/dim]")
