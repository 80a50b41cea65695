"""`ctxlab eval`: what the model can still do with its context, beside what the context cost.

`ctxlab eval` runs a task x length x depth grid for each policy and writes one JSON row per
sample, a summary table, heatmaps and score-against-bytes plots. Subcommands run the lost-in-
the-middle sweep (per policy), streaming perplexity and the attention measurement (sinks and
heavy hitters), and re-summarize a rows file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import typer

from ctxlab.commands.options import (
    DEFAULT_MODEL,
    BudgetOpt,
    JsonOpt,
    ModelOpt,
    RopeScalingOpt,
    SeedOpt,
    ThreadsOpt,
    announce_rope_scaling,
    input_file,
    output_dir,
    set_threads,
)
from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_positive
from ctxlab.json_output import dumps
from ctxlab.outputs import write_text
from ctxlab.peer.url import base_url as root_url

eval_app = typer.Typer(
    help="Long-context evaluation: RULER-style grid, lost in the middle, streaming perplexity, "
    "where attention goes.",
    invoke_without_command=True,
    no_args_is_help=False,
)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CtxlabError(f"{what} must be comma-separated whole numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise CtxlabError(f"{what} must be positive whole numbers, got {text!r}")
    return values


def _out_dir(out: Path | None, kind: str) -> Path:
    return output_dir(out or Path("out") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


@eval_app.callback()
def grid(
    ctx: typer.Context,
    suite: str = typer.Option(
        "quick",
        "--suite",
        help="quick, standard or ruler (tasks, lengths, depths; see the README).",
    ),
    policy: str = typer.Option(
        "full", "--policy", help="Comma list, e.g. full,snapkv,h2o,streaming or snapkv@128."
    ),
    budget: BudgetOpt = None,
    tasks: str = typer.Option(None, "--tasks", help="Override the suite's tasks (comma list)."),
    lengths: str = typer.Option(None, "--lengths", help="Override lengths, e.g. 512,1024,2048."),
    depths: int = typer.Option(None, "--depths", help="Number of needle depths from 0% to 100%."),
    samples: int = typer.Option(None, "--samples", help="Samples per cell."),
    seed: SeedOpt = 0,
    backend: str = typer.Option(
        "ctxlab",
        "--backend",
        help="ctxlab (this engine) or openai (a server: asks it for --model when it serves "
        "that name, else for the one model it serves; --model's tokenizer sizes the prompts).",
    ),
    base_url: str = typer.Option(
        None, "--base-url", help="OpenAI-compatible server for --backend openai (/v1 optional)."
    ),
    api_key: str = typer.Option(
        None, "--api-key", help="Bearer key for --base-url (default: $OPENAI_API_KEY when set)."
    ),
    timeout: float = typer.Option(
        600.0, "--timeout", help="Total seconds per request to --base-url, however it trickles."
    ),
    model: ModelOpt = DEFAULT_MODEL,
    rope_scaling: RopeScalingOpt = None,
    threshold: float = typer.Option(
        None, "--threshold", help="Effective-length bar: absolute score (default 85.6, RULER's)."
    ),
    relative: float = typer.Option(
        None,
        "--relative-threshold",
        help="Bar as a fraction of full's score at the shortest length.",
    ),
    out: Path = typer.Option(
        None, "--out", help="Output folder (default out/eval-TIMESTAMP).", show_default=False
    ),
    as_json: JsonOpt = False,
) -> None:
    """Run the RULER-style grid for each policy; rows, tables and plots go to the output folder."""
    if ctx.invoked_subcommand is not None:
        return
    from ctxlab.eval.runner import Grid, PolicyRun, depth_grid
    from ctxlab.eval.suites import get_suite, parse_policy_runs
    from ctxlab.eval.tasks import get_task

    chosen = get_suite(suite)
    task_names = [t.strip() for t in tasks.split(",")] if tasks else list(chosen.tasks)
    for name in task_names:
        get_task(name)
    if samples is not None and samples <= 0:
        raise CtxlabError(f"--samples must be positive, got {samples}")
    if depths is not None and depths <= 0:
        raise CtxlabError(f"--depths must be positive, got {depths}")
    _check_thresholds(threshold, relative)
    if backend not in ("ctxlab", "openai"):
        raise CtxlabError(f"unknown backend {backend!r}; use ctxlab or openai")
    if backend == "openai" and not base_url:
        raise CtxlabError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000)")
    if backend == "openai":
        base_url = root_url(base_url, "--base-url")
        check_positive(timeout, "--timeout")
    grid_lengths = _ints(lengths, "--lengths") if lengths else list(chosen.lengths)
    runs = [PolicyRun(name, b) for name, b in parse_policy_runs(policy, budget)]
    if backend == "openai" and any(r.policy != "full" for r in runs):
        raise CtxlabError(
            "a remote server's cache policy is its own; use --policy full with openai"
        )
    grid_spec = Grid(
        tasks=task_names,
        lengths=grid_lengths,
        depths=depth_grid(depths or chosen.depths),
        samples=samples or chosen.samples,
        seed=seed,
        runs=runs,
    )
    from ctxlab.arch.rope_scaling import RopeOverride, scaled_positions

    override = RopeOverride.parse(rope_scaling)
    if backend == "openai" and override is not None:
        raise CtxlabError("a remote server's RoPE is its own; give --rope-scaling without openai")
    if backend == "ctxlab":
        from ctxlab.model.registry import model_positions

        # A missing model, or a length beyond its positions, is one sentence before any work.
        limit = scaled_positions(model_positions(model), rope_scaling)
        if limit is not None and max(grid_lengths) > limit:
            raise CtxlabError(
                f"--lengths {max(grid_lengths):,} is beyond the model's {limit:,} positions; "
                f"give lengths up to {limit:,}"
            )
    folder = _out_dir(out, "eval")
    announce_rope_scaling(rope_scaling)
    from ctxlab.eval.harness import run_eval

    key = api_key or os.environ.get("OPENAI_API_KEY")
    summary = run_eval(
        grid_spec, backend, base_url, model, folder, threshold, relative, as_json,
        api_key=key, timeout_s=timeout, rope_scaling=rope_scaling,
    )  # fmt: skip
    if as_json:
        typer.echo(dumps(summary, indent=2))


def _check_thresholds(threshold: float | None, relative: float | None) -> None:
    """The effective-length bar: a score in (0, 100] or a fraction in (0, 1], not both."""
    if threshold is not None and relative is not None:
        raise CtxlabError("give --threshold or --relative-threshold, not both")
    if threshold is not None and not 0 < threshold <= 100:
        raise CtxlabError(f"--threshold is a score in (0, 100], got {threshold}")
    if relative is not None and not 0 < relative <= 1:
        raise CtxlabError(f"--relative-threshold is a fraction in (0, 1], got {relative}")


@eval_app.command("summarize")
def summarize(
    rows: Path = typer.Argument(..., help="A rows.jsonl written by ctxlab eval."),
    threshold: float = typer.Option(
        None, "--threshold", help="Effective-length bar: absolute score (default 85.6, RULER's)."
    ),
    relative: float = typer.Option(
        None,
        "--relative-threshold",
        help="Bar as a fraction of full's score at the shortest length.",
    ),
    as_json: JsonOpt = False,
    compact: bool = typer.Option(
        False, "--compact", help="Skip the per-cell table; print the policy x length means."
    ),
) -> None:
    """Tables, effective lengths and plots from an existing rows file (no model needed)."""
    from ctxlab.eval.harness import summarize_rows
    from ctxlab.eval.summary import read_rows

    input_file(rows, "rows file", "rows.jsonl written by ctxlab eval")
    _check_thresholds(threshold, relative)
    doc = summarize_rows(
        read_rows(rows), rows.parent, threshold, relative, as_json, per_cell=not compact
    )
    if as_json:
        typer.echo(dumps(doc, indent=2))


@eval_app.command("perplexity")
def perplexity(
    tokens: int = typer.Option(2048, "--tokens", help="Length of the streamed text in tokens."),
    cache: int = typer.Option(256, "--cache", help="Cache budget of window and streaming."),
    chunk: int = typer.Option(32, "--chunk", help="Tokens fed per step (1 = token by token)."),
    segment: int = typer.Option(256, "--segment", help="Tokens per perplexity segment."),
    model: ModelOpt = DEFAULT_MODEL,
    out: Path = typer.Option(
        None, "--out", help="Output folder (default out/ppl-TIMESTAMP).", show_default=False
    ),
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stream a text longer than the cache through full, window and streaming (sinks)."""
    from rich.console import Console
    from rich.table import Table

    from ctxlab.eval.perplexity import (
        STREAM_RUNS,
        check_stream_args,
        plot_streaming,
        streaming_perplexity,
        text_ids,
    )
    from ctxlab.progress import progress

    check_stream_args(tokens, cache, chunk, segment)
    set_threads(threads)
    folder = _out_dir(out, "ppl")
    from ctxlab.model.open_model import open_model

    loaded = open_model(model)
    ids = text_ids(loaded.tokenizer, tokens)
    console = Console(stderr=as_json)
    with progress(
        f"streaming {tokens:,} tokens through full, window and streaming", total=len(STREAM_RUNS)
    ) as bar:
        results = streaming_perplexity(
            loaded, ids, cache, chunk, segment, on_chunk=lambda _label, _n: bar.advance()
        )
    trained = getattr(loaded.config, "max_position", None)
    kv_dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
    png = plot_streaming(
        results, trained, cache, folder / "streaming_perplexity.png", kv_dtype=kv_dtype
    )
    doc = {
        "tokens": tokens,
        "cache_tokens": cache,
        "chunk": chunk,
        "trained_length": trained,
        "runs": [r.__dict__ for r in results],
        "plot": str(png),
    }
    write_text(folder / "streaming_perplexity.json", json.dumps(doc, indent=2), "--out")
    if as_json:
        typer.echo(dumps(doc, indent=2))
        return
    table = Table(
        title=f"perplexity per {segment}-token segment ({tokens} tokens, cache {cache} tokens, "
        f"{kv_dtype} KV)"
    )
    table.add_column("tokens")
    for r in results:
        table.add_column(f"{r.label} ({r.position_mode})", justify="right")
    for i, end in enumerate(results[0].segment_ends):
        table.add_row(str(end), *(f"{r.segment_ppl[i]:.1f}" for r in results))
    table.add_row("overall", *(f"{r.overall_ppl:.1f}" for r in results))
    table.add_row("KV at end (MiB)", *(f"{r.resident_kv_bytes / 2**20:.1f}" for r in results))
    console.print(table)
    console.print(f"plot: {png}")


@eval_app.command("lost-in-middle")
def lost_in_middle(
    documents: int = typer.Option(10, "--documents", help="Documents per prompt (k)."),
    samples: int = typer.Option(3, "--samples", help="Seeds per position."),
    seed: SeedOpt = 0,
    policy: str = typer.Option(
        "full",
        "--policy",
        help="Comma list, e.g. full,snapkv@0.5: the same prompts under each, so position "
        "bias and eviction read together.",
    ),
    budget: BudgetOpt = None,
    model: ModelOpt = DEFAULT_MODEL,
    out: Path = typer.Option(
        None, "--out", help="Output folder (default out/lim-TIMESTAMP).", show_default=False
    ),
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Accuracy by the gold document's position among k documents (Liu et al., 2023), with
    Wilson intervals, for each policy."""
    from ctxlab.eval.harness import run_lost_in_middle
    from ctxlab.eval.runner import PolicyRun
    from ctxlab.eval.suites import parse_policy_runs

    if documents < 2 or samples < 1:
        raise CtxlabError("--documents must be at least 2 and --samples at least 1")
    runs = [PolicyRun(name, b) for name, b in parse_policy_runs(policy, budget)]
    if not runs:
        raise CtxlabError("--policy names no policy; give e.g. full or full,snapkv@0.5")
    set_threads(threads)
    folder = _out_dir(out, "lim")
    from ctxlab.model.registry import resolve_model_path

    resolve_model_path(model)
    doc = run_lost_in_middle(model, documents, samples, seed, folder, as_json, runs)
    if as_json:
        typer.echo(dumps(doc, indent=2))


@eval_app.command("attention")
def attention(
    tokens: int = typer.Option(2048, "--tokens", help="Prompt length in tokens (real prose)."),
    prompts: int = typer.Option(
        4, "--prompts", help="Disjoint prompts; the interval is across them."
    ),
    queries: int = typer.Option(
        64, "--queries", help="Query positions per prompt, evenly over its second half."
    ),
    sinks: int = typer.Option(4, "--sinks", help="k: the first tokens counted as sinks."),
    model: ModelOpt = DEFAULT_MODEL,
    plot: Path = typer.Option(
        None, "--plot", help="Write a PNG: per layer and KV head, sinks and heavy hitters."
    ),
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Attention sinks and heavy hitters per layer and KV head, measured on this model."""
    from ctxlab.commands.options import plot_path

    for value, flag in ((tokens, "--tokens"), (prompts, "--prompts"), (queries, "--queries")):
        if value < 1:
            raise CtxlabError(f"{flag} must be a positive whole number, got {value}")
    if tokens < 16:
        raise CtxlabError(f"--tokens must be at least 16, got {tokens}")
    if not 1 <= sinks < tokens // 2:
        raise CtxlabError(f"--sinks must be from 1 to under half of --tokens, got {sinks}")
    if plot is not None:
        plot_path(plot)
    from ctxlab.model.registry import model_label, model_positions

    limit = model_positions(model)
    if limit is not None and tokens > limit:
        raise CtxlabError(f"--tokens {tokens:,} is beyond the model's {limit:,} positions")
    set_threads(threads)
    from ctxlab.eval.attention import measure_prompts
    from ctxlab.eval.attention_report import LABELS, plot_attention, summarize
    from ctxlab.model.open_model import open_model
    from ctxlab.progress import progress

    loaded = open_model(model, enabled=not as_json)
    with progress(f"measuring attention on {prompts} prompts", total=prompts) as bar:
        measures = measure_prompts(loaded, tokens, prompts, queries, sinks, bar.advance)
    doc = summarize(measures, loaded.config.sliding_windows, sinks)
    doc = {"model": model_label(model), **doc}
    if plot is not None:
        doc["plot"] = str(plot_attention(doc, model_label(model), plot))
    if as_json:
        typer.echo(dumps(doc, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    uniform = doc["uniform"]
    table = Table(
        title=f"{doc['model']}: attention mass, mean ± half the 95 % interval across {prompts} "
        f"prompts "
        f"of {tokens:,} tokens, {doc['queries_per_prompt']} queries each; uniform would give "
        f"{uniform['sinks']:.4f} to the first {sinks} tokens"
    )
    names = ("first", "sinks", "oldest", "top1", "top20")
    table.add_column("layer")
    for name in names:
        table.add_column(LABELS[name], justify="right")
    rows = [(str(r["layer"]) + (f" (W {r['window']})" if r["window"] else ""), r)
            for r in doc["layers"]]  # fmt: skip
    rows += [(f"all {kind} ({g['layers']})", g) for kind, g in doc["by_kind"].items()]
    for label, r in rows:
        table.add_row(
            label, *(f"{r[n]['value']:.3f} ± {(r[n]['high'] - r[n]['low']) / 2:.3f}" for n in names)
        )
    Console().print(table)
    if plot is not None:
        Console().print(f"plot: {plot}")


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
