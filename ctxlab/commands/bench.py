"""`ctxlab bench serve`: placeholder until the load generator lands (next commit)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    bench = typer.Typer(help="Load generators.", no_args_is_help=True)
    app.add_typer(bench, name="bench")
