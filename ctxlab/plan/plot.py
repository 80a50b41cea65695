"""KV bytes per request against context length, one line per architecture.

The picture shows what the tables cannot: full-attention caches grow linearly, sliding
windows flatten, MLA sits an order of magnitude lower, recurrent layers add a constant.
matplotlib is imported inside the function (Agg backend) so the planner starts fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ctxlab.arch.spec import ArchSpec
from ctxlab.plan.units import GIB


def context_grid(max_context: int, extra: Sequence[int] = ()) -> list[int]:
    """Powers of two from 256 up to `max_context`, plus the lengths asked for."""
    grid = {2**k for k in range(8, 31) if 2**k <= max_context}
    grid.update(c for c in extra if c > 0)
    grid.add(max_context)
    return sorted(grid)


def plot_kv_vs_context(
    archs: Sequence[ArchSpec], contexts: Sequence[int], path: str | Path, title: str = ""
) -> Path:
    """Write a PNG of KV GiB per request against context (log x) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    grid = context_grid(max(max(contexts), 4096), contexts)
    fig, ax = plt.subplots(figsize=(8, 5))
    for arch in archs:
        ax.plot(grid, [arch.request_bytes(c) / GIB for c in grid], marker=".", label=arch.name)
    for c in contexts:
        ax.axvline(c, color="grey", linewidth=0.6, linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("KV cache per request (GiB)")
    ax.set_title(title or "Logical KV cache per request")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
