"""The one entry point: `ctxlab plan|generate|eval|simulate|serve|bench|memory|workshop|lab`.

Each command lives in `ctxlab/commands/<name>.py` and registers itself on the app. Command
modules import their heavy dependencies (torch, transformers) inside the command body, so
`ctxlab plan --help` starts without loading a model stack.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

import typer
from typer.core import TyperArgument, TyperOption

from ctxlab import __version__

try:  # typer vendors click from 0.20 on; its usage errors are that copy's classes
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover - an older typer on the PyPI click
    from click.exceptions import NoArgsIsHelpError, UsageError
from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_finite, check_text
from ctxlab.outputs import FULL_OR_READ_ONLY, write_error
from ctxlab.peer.url import redact

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
    "probe",
    "watch",
    "export_hf",
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


def _checked(process: Callable[..., object]) -> Callable[..., object]:
    """Every number a flag or argument takes is finite, and every string is text.

    One check for every option of every command (and of any command added later): `nan` and
    `inf` are one sentence, so no command computes with them or prints `Infinity` under
    --json (an option whose default is infinite, `bench serve --request-rate inf`, still
    takes that value); bytes that are not UTF-8 in an argument (Python hands them over as
    lone surrogates) are one sentence, not a crash in the tokenizer or SQLite. Paths are
    left alone: a file name may be any bytes.
    """

    def checked(self: TyperOption | TyperArgument, ctx: object, value: object) -> object:
        value = process(self, ctx, value)
        name = (
            self.opts[0]
            if isinstance(self, TyperOption)
            else str(self.metavar or self.name).upper()
        )
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, str):
                check_text(item, name)
            elif item != self.default:
                check_finite(item, name)
        return value

    return checked


TyperOption.process_value = _checked(TyperOption.process_value)  # type: ignore[method-assign]
TyperArgument.process_value = _checked(TyperArgument.process_value)  # type: ignore[method-assign]


def main() -> None:
    """Run the CLI; a user mistake is one sentence on stderr and exit code 2.

    Mistakes come as CtxlabError from our checks, or as click's usage errors (an unknown
    option or command, a word where a number goes), which would otherwise print a boxed panel.
    """
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as exc:
        exc.show()  # the command's help, as `ctxlab plan` alone has always printed
        sys.exit(exc.exit_code)
    except UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "ctxlab"
        message = redact(exc.format_message()).rstrip(".")  # a URL's password never shows
        typer.echo(f"error: {message}; see '{where} --help'.", err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo("aborted.", err=True)
        sys.exit(130)
    except CtxlabError as exc:
        typer.echo(f"error: {redact(str(exc))}", err=True)
        sys.exit(2)
    except OSError as exc:  # a write that no helper wrapped: still one sentence, no traceback
        if exc.errno not in FULL_OR_READ_ONLY:
            raise
        typer.echo(f"error: {write_error(exc.filename or 'a result file', exc)}", err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
