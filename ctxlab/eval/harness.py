"""Glue between the eval CLI and the pieces: load the model once, run, summarize, print.

Kept out of the runner so the runner stays testable without a model, and out of the CLI so
the workshop can call the same functions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ctxlab.errors import CtxlabError
from ctxlab.eval.runner import Grid, PolicyRun, run_grid
from ctxlab.eval.sample import TokenCounter
from ctxlab.eval.scoring import RULER_THRESHOLD
from ctxlab.eval.summary import (
    Row,
    cells,
    effective_lengths,
    kv_dtype_label,
    length_means,
    plot_heatmaps,
    plot_score_vs_bytes,
)
from ctxlab.outputs import save_figure, write_text
from ctxlab.stats import Interval


def pool_tokens_for(grid: Grid, batch_size: int) -> int:
    """Room for a full batch of the longest samples, so the eval never measures preemption."""
    return max(grid.lengths) * batch_size + 1024


def run_eval(
    grid: Grid,
    backend: str,
    base_url: str | None,
    model: str,
    out_dir: Path,
    threshold: float | None,
    relative: float | None,
    quiet: bool = False,
    batch_size: int = 4,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    rope_scaling: str | None = None,
) -> dict[str, Any]:
    """`api_key` and `timeout_s` (total seconds per request) are for backend openai;
    `rope_scaling` (`ctxlab.model.rope_override`) for this engine, named in every row."""
    from ctxlab.progress import progress

    console = Console(stderr=True)
    if backend == "openai":
        from ctxlab.eval.engine_backend import token_counter
        from ctxlab.eval.openai_backend import OpenAIBackend
        from ctxlab.model.registry import resolve_model_path
        from ctxlab.model.tokenizer import load_tokenizer
        from ctxlab.peer.url import public, redact

        count = token_counter(load_tokenizer(str(resolve_model_path(model))))
        remote = OpenAIBackend(str(base_url), api_key=api_key, timeout_s=timeout_s, prefer=model)
        model_name = f"remote:{remote.served_model()}@{redact(public(remote.base_url))}"

        def backend_for(run: PolicyRun) -> Any:
            return remote
    else:
        from ctxlab.eval.engine_backend import EngineBackend, token_counter
        from ctxlab.model.open_model import open_model

        loaded = open_model(model, enabled=not quiet, rope_scaling=rope_scaling)
        count = token_counter(loaded.tokenizer)
        model_name = model if loaded.rope_override is None else f"{model}+{loaded.rope_override}"
        pool = pool_tokens_for(grid, batch_size)

        def backend_for(run: PolicyRun) -> Any:
            return EngineBackend(loaded, run, kv_pool_tokens=pool)

    rows_path = out_dir / "rows.jsonl"
    rows_path.unlink(missing_ok=True)
    with progress("eval samples", total=grid.size(), enabled=not quiet) as bar:
        rows = run_grid(
            grid,
            count,
            backend_for,
            rows_path,
            model_name,
            on_progress=bar.advance,
            batch_size=batch_size,
        )
    console.print(f"rows: {rows_path}")
    return summarize_rows(rows, out_dir, threshold, relative, quiet)


def summarize_rows(
    rows: Sequence[Row],
    out_dir: Path,
    threshold: float | None,
    relative: float | None,
    quiet: bool = False,
    per_cell: bool = True,
) -> dict[str, Any]:
    """Print the task x length x policy table (unless `per_cell` is off), the policy x length
    means and effective lengths; write summary.json and plots."""
    console = Console(stderr=quiet)
    table_cells = cells(rows)
    if relative is not None:
        eff = effective_lengths(rows, relative, relative=True)
    else:
        eff = effective_lengths(rows, threshold if threshold is not None else RULER_THRESHOLD)
    no_bytes = all(r.get("resident_kv_bytes") is None for r in rows)
    remote = any(r.get("backend") == "openai" for r in rows)
    table = Table(
        title="score (0-100) and resident KV measured from the pool, per cell "
        f"({kv_dtype_label(rows)} KV)"
    )
    columns = ("task", "length", "policy", "score", "95 % interval", "resident KV (MiB)", "samples")
    for column in columns:
        table.add_column(column, justify="right" if column not in ("task", "policy") else "left")
    for c in table_cells:
        kv = "n/a" if c.kv_bytes is None else f"{c.kv_bytes / 2**20:.2f}"
        ci = f"[{c.score_low:.1f}, {c.score_high:.1f}]" if c.score_low is not None else "-"
        table.add_row(c.task, str(c.length), c.policy, f"{c.score:.1f}", ci, kv, str(c.samples))
    if per_cell:
        console.print(table)
    console.print(_length_means_table(rows))
    if no_bytes:
        why = "remote backend: its cache is not visible here" if remote else "not in these rows"
        console.print(f"KV bytes: not measured ({why}).")
    eff_table = Table(title="effective context length (mean of all tasks at each length)")
    eff_table.add_column("policy")
    eff_table.add_column("effective length", justify="right")
    eff_table.add_column("how it was decided")
    for policy, result in sorted(eff.items()):
        eff_table.add_row(policy, result.shown, result.explanation)
    console.print(eff_table)
    plots = plot_heatmaps(rows, out_dir) + plot_score_vs_bytes(rows, out_dir)
    doc: dict[str, Any] = {
        "cells": [c.__dict__ for c in table_cells],
        "length_means": {
            p: {str(n): m.__dict__ for n, m in by_len.items()}
            for p, by_len in length_means(rows).items()
        },
        "effective_length": {
            p: {
                "length": e.length,
                "threshold": e.threshold,
                "basis": e.basis,
                "established": e.established,
                "explanation": e.explanation,
            }
            for p, e in eff.items()
        },
        "kv_bytes_measured": not no_bytes,
        "plots": [str(p) for p in plots],
    }
    write_text(out_dir / "summary.json", json.dumps(doc, indent=2))
    console.print(f"summary: {out_dir / 'summary.json'}; plots: {len(plots)} PNG in {out_dir}")
    return doc


def _length_means_table(rows: Sequence[Row]) -> Table:
    means = length_means(rows)
    lengths = sorted({n for by_len in means.values() for n in by_len})
    table = Table(title="mean score over tasks (resident KV MiB), per policy and length")
    table.add_column("policy")
    for n in lengths:
        table.add_column(f"{n:,}", justify="right")
    for policy, by_len in means.items():
        row = [policy]
        for n in lengths:
            m = by_len.get(n)
            kv = "" if m is None or m.kv_bytes is None else f" ({m.kv_bytes / 2**20:.1f})"
            row.append("" if m is None else f"{m.score:.1f}{kv}")
        table.add_row(*row)
    return table


def _check_documents_fit(documents: int, seed: int, count: TokenCounter, limit: int) -> None:
    """Refuse k documents whose prompt would pass the model's positions, before building any
    of the k prompts of k documents (k squared work): the prompt grows by about one
    document's tokens per document, measured here on prompts of two and three."""
    from ctxlab.eval.lost_in_middle import lost_in_middle_samples

    two, three = (lost_in_middle_samples(n, seed, count)[0] for n in (2, 3))
    per_doc = max(1, three.prompt_tokens - two.prompt_tokens)
    need = two.prompt_tokens + (documents - 2) * per_doc + two.max_new_tokens
    if need > limit:
        most = 2 + max(0, limit - two.prompt_tokens - two.max_new_tokens) // per_doc
        raise CtxlabError(
            f"--documents {documents:,} makes prompts of about {need:,} tokens, beyond the "
            f"model's {limit:,} positions; give at most about {most} documents."
        )


def run_lost_in_middle(
    model: str,
    documents: int,
    samples: int,
    seed: int,
    out_dir: Path,
    quiet: bool,
    runs: Sequence[PolicyRun] = (PolicyRun(),),
) -> dict[str, Any]:
    """Accuracy by gold position for each policy run, over `samples` seeds (the same prompts
    for every run, so position bias and eviction read together); rows and a plot in out_dir.

    A prompt counts as answered when its string-match score is 100; each position's accuracy
    has its Wilson 95 % interval (n = samples)."""
    from ctxlab.eval.engine_backend import EngineBackend, token_counter
    from ctxlab.eval.lost_in_middle import lost_in_middle_samples
    from ctxlab.eval.scoring import string_match
    from ctxlab.model.open_model import open_model
    from ctxlab.progress import progress
    from ctxlab.stats import wilson

    console = Console(stderr=quiet)
    loaded = open_model(model)
    count = token_counter(loaded.tokenizer)
    _check_documents_fit(documents, seed, count, int(loaded.config.max_position))
    all_samples = [
        s for k in range(samples) for s in lost_in_middle_samples(documents, seed + k, count)
    ]
    longest = max(s.prompt_tokens + s.max_new_tokens for s in all_samples)
    rows = []
    curves: dict[str, list[Interval]] = {}
    kv_dtype = ""
    with progress("answering the prompts", total=len(all_samples) * len(runs)) as bar:
        for run in runs:
            label = run.policy if run.budget is None else f"{run.policy}@{run.budget}"
            backend = EngineBackend(loaded, run, kv_pool_tokens=longest * 4 + 1024)
            kv_dtype = backend.kv_dtype
            for start in range(0, len(all_samples), 4):
                batch = all_samples[start : start + 4]
                for s, gen in zip(batch, backend.generate(batch), strict=True):
                    rows.append(
                        {
                            "task": s.task,
                            "policy": run.policy,
                            "budget": run.budget,
                            "position_mode": backend.position_mode,
                            "position": round(s.depth * (documents - 1)),
                            "seed": s.seed,
                            "score": string_match(gen.text, s.references, s.metric),
                            "prediction": gen.text,
                            "references": list(s.references),
                            "prompt_tokens": s.prompt_tokens,
                            "resident_kv_bytes": gen.resident_kv_bytes,
                        }
                    )
                bar.advance(len(batch))
                # rewritten after every batch, so an interrupted run keeps what it answered
                write_text(out_dir / "rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
            mine = [r for r in rows if r["policy"] == run.policy and r["budget"] == run.budget]
            curves[label] = [
                wilson(
                    sum(r["score"] == 100 for r in mine if r["position"] == p),
                    sum(1 for r in mine if r["position"] == p),
                )
                for p in range(documents)
            ]
    from ctxlab.model.registry import model_label

    png = _plot_lost_in_middle(
        curves,
        documents,
        samples,
        f"{model_label(model)}, {kv_dtype} KV",
        out_dir / "lost_in_middle.png",
    )
    table = Table(title=f"accuracy by gold-document position [Wilson 95 %], n = {samples} each")
    table.add_column("position")
    for label in curves:
        table.add_column(label, justify="right")
    for p in range(documents):
        cells = (f"{100 * c[p].value:.0f} [{100 * c[p].low:.0f}, {100 * c[p].high:.0f}]"
                 for c in curves.values())  # fmt: skip
        table.add_row(str(p + 1), *cells)
    console.print(table)
    console.print(f"rows: {out_dir / 'rows.jsonl'}; plot: {png}")
    first = next(iter(curves.values()))
    return {
        "documents": documents,
        "samples": samples,
        "score_by_position": [100 * c.value for c in first],
        "accuracy_by_position": {
            label: [c.to_json() for c in curve] for label, curve in curves.items()
        },
        "plot": str(png),
    }


def _plot_lost_in_middle(
    curves: dict[str, list[Interval]], documents: int, samples: int, what: str, png: Path
) -> Path:
    """One line per policy: accuracy by gold position with its Wilson interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    shift = 0.08
    for i, (label, curve) in enumerate(curves.items()):
        x = [p + 1 + (i - (len(curves) - 1) / 2) * shift for p in range(documents)]
        y = [100 * c.value for c in curve]
        err = [[100 * (c.value - c.low) for c in curve], [100 * (c.high - c.value) for c in curve]]
        ax.errorbar(x, y, yerr=err, fmt="o-", capsize=2, label=label)
    ax.set_xlabel("position of the gold document (1 = first)")
    ax.set_ylabel("accuracy (%), Wilson 95 %")
    ax.set_ylim(-5, 105)
    ax.set_title(f"lost in the middle: {what}, {documents} documents, n = {samples} per point")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, png, dpi=110)
    plt.close(fig)
    return png
