"""The residency plot: blocks resident over time, evictions marked (matplotlib, PNG)."""

from __future__ import annotations

from pathlib import Path

from ctxlab.kvevents.residency import Residency
from ctxlab.outputs import save_figure


def plot_residency(res: Residency, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    t0 = res.timeline[0][0] if res.timeline else 0.0
    if res.timeline:
        ax.step(
            [t - t0 for t, _ in res.timeline],
            [n for _, n in res.timeline],
            where="post",
            label="blocks resident",
        )
    if res.evictions:
        ax.scatter(
            [e.at - t0 for e in res.evictions],
            [e.resident_before - 1 for e in res.evictions],
            marker="x",
            color="tab:red",
            s=14,
            label="block removed",
        )
    if res.first is not None:  # a removal says the pool was full at some point
        ax.axhline(res.peak_resident, ls=":", color="grey", label="most blocks cached at once")
    ax.set_xlabel("seconds since the first batch (publisher's clock)")
    ax.set_ylabel("blocks in the prefix cache")
    ax.set_title(title)
    if res.timeline:
        ax.legend(loc="best", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no KV events arrived", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    try:
        return save_figure(fig, path, "--out")
    finally:
        plt.close(fig)
