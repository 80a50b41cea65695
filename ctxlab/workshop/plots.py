"""The workshop's figures (matplotlib, PNG), one function per demonstration that draws one.

Each function takes the numbers the demonstration measured and the path to write, and
returns the path. Drawn off-screen (Agg); the HTML report embeds the files as data URIs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctxlab.workshop.measure import Sent
    from ctxlab.workshop.result import JSONObject


def _figure(width: float = 7.5, height: float = 3.4):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, plt.subplots(1, 2, figsize=(width, height))


def _save(plt, fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_warm_prefix(runs: dict[str, list[Sent]], path: Path) -> Path:
    """TTFT and TPOT of every repeat, cold against warm (the spread is the point)."""
    plt, (fig, (left, right)) = _figure()
    for ax, what, label in ((left, "ttft_ms", "TTFT (ms)"), (right, "tpot_ms", "TPOT (ms)")):
        for x, side in enumerate(("cold", "warm")):
            ys = [getattr(s, what) for s in runs[side]]
            ax.scatter([x] * len(ys), ys, alpha=0.7, label=side)
        ax.set_xticks([0, 1], ["cold", "warm"])
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    left.set_title("first token: reuse removes prefill")
    right.set_title("per output token: unchanged")
    return _save(plt, fig, path)


def plot_page_size(
    pages: list[int],
    measured: list[int],
    planned: list[int],
    reused: list[int],
    reused_plan: list[int],
    path: Path,
) -> Path:
    """Rounding waste and reuse at a divergence, measured (dots) against the planner (line)."""
    plt, (fig, (left, right)) = _figure()
    left.plot(pages, planned, "-", color="grey", label="planner")
    left.plot(pages, measured, "o", label="measured (pool)")
    left.set_xscale("log", base=2)
    left.set_xlabel("page size (tokens)")
    left.set_ylabel("wasted token slots")
    left.set_title("rounding waste")
    right.plot(pages, reused_plan, "-", color="grey", label="planner")
    right.plot(pages, reused, "o", label="measured")
    right.set_xscale("log", base=2)
    right.set_xlabel("page size (tokens)")
    right.set_ylabel("reused tokens")
    right.set_title("reuse at a divergence")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_eviction(ttft: dict[str, dict[str, list[float]]], path: Path) -> Path:
    """TTFT distribution per arrival order: engine (measured) against simulator (modeled)."""
    plt, (fig, axes) = _figure()
    for ax, order in zip(axes, ("grouped", "interleaved"), strict=True):
        for side, style in (("engine", "-"), ("simulator", "--")):
            ys = sorted(ttft[order][side])
            n = len(ys)
            ax.step(ys, [(i + 1) / n for i in range(n)], style, where="post", label=side)
        ax.set_title(f"{order} arrivals")
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_recurrent(rows: list[JSONObject], path: Path) -> Path:
    """Concurrency reached and p99 TTFT per architecture and workload (modeled)."""
    plt, (fig, (left, right)) = _figure()
    labels = [f"{r['arch']}\n{r['workload']}" for r in rows]
    xs = range(len(rows))
    left.bar(xs, [r["concurrency"] for r in rows], color="tab:blue")
    left.set_ylabel("requests running at once")
    right.bar(xs, [r["ttft_p99_ms"] / 1e3 for r in rows], color="tab:orange")
    right.set_ylabel("p99 TTFT (s)")
    for ax in (left, right):
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    left.set_title("equal memory: concurrency")
    right.set_title("equal memory: p99 TTFT")
    return _save(plt, fig, path)


def plot_compaction(counts: dict[str, dict[str, float]], ceiling: float | None, path: Path) -> Path:
    """Per strategy: where the planted facts are (stacked), and what reached the answer."""
    plt, (fig, (left, right)) = _figure(8.5, 3.6)
    labels = [name.replace(" (", "\n(") for name in counts]
    xs = list(range(len(counts)))
    bottom = [0.0] * len(xs)
    for status, colour in (
        ("in context", "tab:green"),
        ("recoverable", "tab:orange"),
        ("lost", "tab:red"),
    ):
        ys = [c[status] for c in counts.values()]
        left.bar(xs, ys, bottom=bottom, color=colour, label=status)
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    left.set_ylabel("planted facts")
    left.set_title("where the facts are after compaction")
    facts = max(bottom) or 1
    width = 0.4
    right.bar(
        [x - width / 2 for x in xs],
        [100 * c["in prompt"] / facts for c in counts.values()],
        width,
        color="tab:blue",
        label="answer in the prompt when asked",
    )
    acc = [c["accuracy_pct"] for c in counts.values()]
    err = None
    if all("accuracy_low_pct" in c and "accuracy_high_pct" in c for c in counts.values()):
        err = [
            [a - c["accuracy_low_pct"] for a, c in zip(acc, counts.values(), strict=True)],
            [c["accuracy_high_pct"] - a for a, c in zip(acc, counts.values(), strict=True)],
        ]
    right.bar(
        [x + width / 2 for x in xs],
        acc,
        width,
        yerr=err,
        capsize=3,
        color="tab:purple",
        label="answered right (95 % interval)" if err else "answered right",
    )
    if ceiling is not None:
        right.axhline(ceiling, color="grey", linestyle="--", label="model's ceiling")
    right.set_ylabel("% of facts")
    right.set_ylim(0, 100)
    right.set_title("what the strategy brought back")
    for ax in (left, right):
        ax.set_xticks(xs, labels, fontsize=7)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    return _save(plt, fig, path)


def plot_retrieval_depth(rows: list[JSONObject], path: Path) -> Path:
    """Per k: evidence found, answers right and citations right (left); tokens added (right)."""
    plt, (fig, (left, right)) = _figure()
    ks = [r["k"] for r in rows]
    for key, label, marker in (
        ("recall_pct", "recall@k", "o"),
        ("accuracy_pct", "accuracy", "s"),
        ("citation_precision_pct", "citation precision", "^"),
    ):
        got = [r for r in rows if r[key] is not None]
        if not got:
            continue
        stem = key.removesuffix("_pct")
        low, high = f"{stem}_low_pct", f"{stem}_high_pct"
        if all(r.get(low) is not None and r.get(high) is not None for r in got):
            err = [[r[key] - r[low] for r in got], [r[high] - r[key] for r in got]]
            left.errorbar(
                [r["k"] for r in got],
                [r[key] for r in got],
                yerr=err,
                marker=marker,
                capsize=3,
                label=f"{label} (95 % interval)",
            )
        else:
            left.plot([r["k"] for r in got], [r[key] for r in got], marker=marker, label=label)
    left.set_xscale("log", base=2)
    left.set_xticks(ks, [str(k) for k in ks])
    left.set_ylim(0, 100)
    left.set_xlabel("k (passages retrieved)")
    left.set_ylabel("%")
    left.set_title("what k finds and what the model does with it")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    right.bar([str(k) for k in ks], [r["retrieved_tokens"] for r in rows], color="tab:grey")
    right.set_xlabel("k")
    right.set_ylabel("retrieved tokens per question")
    right.set_title("what k puts in the prompt")
    right.grid(alpha=0.3, axis="y")
    return _save(plt, fig, path)
