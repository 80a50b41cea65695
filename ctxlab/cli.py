"""The one entry point: `ctxlab plan|generate|eval|simulate|serve|bench|memory|workshop|lab`.

Each command lives in `ctxlab/commands/<name>.py` and registers itself on the app. Command
modules import their heavy dependencies (torch, transformers) inside the command body, so
`ctxlab plan --help` starts without loading a model stack.
"""

from __future__ import annotations

import importlib
import sys

import typer
from typer.core import TyperOption

from ctxlab import __version__
from ctxlab.errors import CtxlabError

# One line per command module; each defines `register(app: typer.Typer) -> None`.
COMMAND_MODULES: tuple[str, ...] = (
    "plan",
    "tour",
    "lab",
    "simulate",
    "policies",
    "generate",
    "eval",
    "profile",
    "serve",
    "bench",
    "memory",
    "rag",
    "workshop",
)

app = typer.Typer(
    name="ctxlab",
    help="Measure what long context costs and what it keeps.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ctxlab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Measure what long context costs and what it keeps."""


for _name in COMMAND_MODULES:
    importlib.import_module(f"ctxlab.commands.{_name}").register(app)


def _flag_type(self: TyperOption, ctx: object) -> str | None:
    """A boolean flag takes no value, so --help shows no `<bool>` type beside it."""
    return None if self.is_flag else _typed(self, ctx)


_typed = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]


def main() -> None:
    """Run the CLI; a user mistake (CtxlabError) is one sentence on stderr and exit code 2.

    Usage errors that typer catches itself (an unknown option, a word where a number goes)
    keep its short panel, which also exits with code 2.
    """
    try:
        app()
    except CtxlabError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
