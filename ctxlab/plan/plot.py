"""KV bytes per request against context length, one line per architecture.

The picture shows what the tables cannot: full-attention caches grow linearly, sliding
windows flatten, MLA sits an order of magnitude lower, recurrent layers add a constant.
Axes read in plain units (4K, 128K tokens; MiB, GiB), the title names the cache dtype, and
the legend explains every line and marker. matplotlib is imported inside the function (Agg
backend) so the planner starts fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ctxlab.arch.spec import ArchSpec
from ctxlab.outputs import save_figure
from ctxlab.plan.units import short_bytes, short_tokens


def context_grid(max_context: int, extra: Sequence[int] = ()) -> list[int]:
    """Powers of two from 256 up to `max_context`, plus the lengths asked for."""
    grid = {2**k for k in range(8, 31) if 2**k <= max_context}
    grid.update(c for c in extra if c > 0)
    grid.add(max_context)
    return sorted(grid)


def plain_axes(ax, x: str | None = "tokens", y: str | None = "bytes") -> None:
    """Tick labels in tokens (4K, 128K) and binary bytes (MiB, GiB) on log-2 axes."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    for axis, kind in ((ax.xaxis, x), (ax.yaxis, y)):
        if kind is None:
            continue
        fmt = short_tokens if kind == "tokens" else short_bytes
        axis.set_major_locator(LogLocator(base=2, numticks=12))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos, fmt=fmt: fmt(v)))


def _dtype_label(archs: Sequence[ArchSpec], cache_dtype: str | None) -> str:
    if cache_dtype:
        return f"{cache_dtype} cache"
    widths = sorted({a.cache_dtype_bytes for a in archs})
    return " / ".join(f"{w:g}-byte" for w in widths) + " cache elements"


def plot_kv_vs_context(
    archs: Sequence[ArchSpec],
    contexts: Sequence[int],
    path: str | Path,
    title: str = "",
    cache_dtype: str | None = None,
) -> Path:
    """Write a PNG of KV bytes per request against context (log-log) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    grid = context_grid(max(max(contexts), 4096), contexts)
    fig, ax = plt.subplots(figsize=(8, 5))
    for arch in archs:
        ax.plot(
            grid,
            [max(arch.request_bytes(c), 1) for c in grid],
            marker=".",
            label=arch.name,
        )
    ax.plot([], [], "k.", label="dots: lengths computed (powers of two and those asked for)")
    for i, c in enumerate(contexts):
        ax.axvline(
            c,
            color="grey",
            linewidth=0.6,
            linestyle=":",
            label="context lengths asked for" if i == 0 else None,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    plain_axes(ax)
    ax.set_xlabel("context length (tokens; K = 1,024)")
    ax.set_ylabel("KV cache per request (binary bytes)")
    ax.set_title(
        (title or "Logical KV cache per request") + f", {_dtype_label(archs, cache_dtype)}"
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path
