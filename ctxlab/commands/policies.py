"""`ctxlab policies`: every KV retention / selection / storage policy, its paper and defaults."""

from __future__ import annotations

import typer

from ctxlab.commands.options import JsonOpt
from ctxlab.json_output import dumps


def _fmt(value: object) -> str:
    return "none" if value is None else str(value)


def policies(
    as_json: JsonOpt = False,
) -> None:
    """List each policy: the stack layer it acts on, its paper, its parameters and defaults."""
    from ctxlab.policy.registry import describe_policies

    rows = describe_policies()
    if as_json:
        typer.echo(dumps({"policies": rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="KV cache policies (--policy NAME --budget TOKENS|RATIO)")
    table.add_column("policy", style="bold")
    table.add_column("layer")
    table.add_column("paper / source")
    table.add_column("parameters (defaults)")
    table.add_column("engine")
    for r in rows:
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in r["params"].items())
        engine = "yes" if r["in_engine"] else "pure code only"
        table.add_row(r["name"], r["layer"], r["paper"], params or "-", engine)
    table.caption = (
        "storage formats compose with any policy: --kv-format int8|kivi4|kivi2 (e.g. --policy "
        "snapkv --budget 256 --kv-format kivi4); --policy quant alone keeps every token, "
        "quantized. Resident KV is measured from the pool: codes, scales, zero points and "
        "the full-precision rows of unfinished KIVI groups."
    )
    Console(width=160).print(table)


def register(app: typer.Typer) -> None:
    app.command("policies")(policies)
