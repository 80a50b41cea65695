"""PNG plots of a run (pool and tier usage over time), of a sweep (reuse and latency) and of a
rate sweep (SLO attainment against the offered rate).

matplotlib is imported inside the functions with the Agg backend, so importing the
simulator stays light and works without a display.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ctxlab.outputs import save_figure
from ctxlab.plan.units import GIB


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _thin(x: list, n: int = 4000) -> np.ndarray:
    """Indices of at most n evenly spread samples (plots do not need 100k points)."""
    return np.unique(np.linspace(0, len(x) - 1, min(len(x), n)).astype(int))


def _legend_below(ax, handles: list, labels: list) -> None:
    """Every line in one legend, under the axes, where it hides no data."""
    ax.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.13),
        ncol=min(len(labels), 3),
        fontsize=8,
        frameon=False,
    )


def usage_plot(result, path: Path, title: str) -> Path:
    plt = _plt()
    tl = result.timeline
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if tl.time:
        idx = _thin(tl.time)
        t = np.asarray(tl.time)[idx]
        used = np.asarray(tl.used, dtype=float)[idx] / GIB
        cached = np.asarray(tl.cached, dtype=float)[idx] / GIB
        tier = np.asarray(tl.tier, dtype=float)[idx] / GIB
        ax.plot(t, used, label="pool used (GiB)", lw=1)
        ax.plot(t, cached, label="of which cached, unreferenced (GiB)", lw=1)
        if tier.any():
            ax.plot(t, tier, label="host tier used (GiB)", lw=1)
        pool = result.setup.pool_bytes
        if pool is not None:
            ax.axhline(pool / GIB, color="grey", ls="--", lw=0.8, label="pool size")
        ax2 = ax.twinx()
        ax2.plot(
            t,
            np.asarray(tl.running)[idx],
            color="black",
            alpha=0.3,
            lw=0.8,
            label="running requests (right axis)",
        )
        ax2.set_ylabel("running requests")
        handles, labels = ax.get_legend_handles_labels()
        more, more_labels = ax2.get_legend_handles_labels()
        _legend_below(ax, handles + more, labels + more_labels)
    else:
        ax.text(0.5, 0.5, "no pool use recorded", ha="center", transform=ax.transAxes)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("GiB (binary)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _save_two_axes(plt, fig, ax, ax2, title: str, path: Path) -> Path:
    """Both axes' lines in one legend under the plot, the title, the file written."""
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    _legend_below(ax, lines[0] + lines2[0], lines[1] + lines2[1])
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def sweep_plot(name: str, labels: list[str], rows: list[dict], path: Path, title: str) -> Path:
    plt = _plt()
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(x, [r["reused_token_fraction"] for r in rows], "o-", label="reused token fraction")
    ax.set_ylim(0, 1)
    ax.set_ylabel("reused token fraction")
    ax.set_xticks(x, labels)
    ax.set_xlabel(name)
    ax2 = ax.twinx()
    ax2.plot(x, [r["ttft_p50"] for r in rows], "s--", color="tab:orange", label="TTFT p50")
    ax2.plot(x, [r["ttft_p99"] for r in rows], "^--", color="tab:red", label="TTFT p99")
    ax2.set_ylabel("TTFT (s, log scale; right axis)")
    ax2.set_yscale("log")
    return _save_two_axes(plt, fig, ax, ax2, title, path)


def rate_plot(swept, answer, rows: list[dict], path: Path, title: str) -> Path:
    """SLO attainment and TTFT p99 against the offered rate, the target drawn across and the
    answer and its cliff marked: where the curve falls through the line is the limit."""
    plt = _plt()
    order = np.argsort([r.rate_per_s for r in swept])
    x = np.array([swept[i].rate_per_s for i in order])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(
        x, [100 * swept[i].attainment for i in order], "o-", label="requests within the SLO (%)"
    )
    ax.axhline(100 * answer.target, color="grey", ls="--", lw=0.8, label="target")
    for run, mark, name in ((answer.best, "g", "highest meeting it"), (answer.cliff, "r", "cliff")):
        if run is not None:
            ax.axvline(run.rate_per_s, color=mark, ls=":", lw=1, label=name)
    ax.set_ylim(0, 105)
    ax.set_ylabel("requests within the SLO (%)")
    ax.set_xscale("log")
    ax.set_xlabel("offered rate (requests/s, log scale)")
    ax2 = ax.twinx()
    ax2.plot(x, [rows[i]["ttft_p99"] for i in order], "^--", color="tab:red", label="TTFT p99")
    ax2.set_ylabel("TTFT p99 (s, log scale; right axis)")
    ax2.set_yscale("log")
    return _save_two_axes(plt, fig, ax, ax2, title, path)
