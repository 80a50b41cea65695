"""The matplotlib set-up the workshop's figures share (PNG, drawn off-screen with Agg).

Each figure is drawn by the demonstration that declares it (`Demonstration.plots`), in its
own file; the HTML report embeds the files as data URIs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ctxlab.outputs import save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def figure(width: float = 7.5, height: float = 3.4) -> tuple[Figure, tuple[Axes, Axes]]:
    """One figure of two panels side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(width, height))
    return fig, (axes[0], axes[1])


def save(fig: Figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)  # whole or absent (a full disk: one sentence)
    plt.close(fig)
    return path
