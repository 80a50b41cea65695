"""Facts kept in context / recoverable by search / lost per strategy (stacked bars) with the
answer accuracy beside them (with its Wilson 95 % interval as an error bar) and the model's
ceiling as a line. matplotlib is imported inside the function (Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ctxlab import stats
from ctxlab.memory.loss import CompactionReport
from ctxlab.outputs import save_figure


def plot_compaction(
    reports: Sequence[CompactionReport], ceiling: float | None, path: str | Path
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    names = [
        r.strategy.replace("summary-", "")
        + ("" if r.strategy == "truncation" else f"\nnote: {r.note_position}")
        for r in reports
    ]
    x = range(len(reports))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    bottom = [0] * len(reports)
    for status, colour in (
        ("in_context", "tab:green"),
        ("recoverable", "tab:orange"),
        ("lost", "tab:red"),
    ):
        counts = [r.count(status) for r in reports]
        left.bar(x, counts, bottom=bottom, color=colour, label=status.replace("_", " "))
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    left.set_xticks(list(x), names, fontsize=8)
    left.set(ylabel="planted facts", title="What compaction kept")
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=8)
    right_ci = [stats.proportion([f.correct for f in r.facts]) for r in reports]
    acc = [r.accuracy for r in reports]
    err = [
        [max(0.0, a - ci.low) for a, ci in zip(acc, right_ci, strict=True)],
        [max(0.0, ci.high - a) for a, ci in zip(acc, right_ci, strict=True)],
    ]
    right.bar(x, acc, yerr=err, capsize=3, color="tab:blue", label="answered right (95 % interval)")
    if ceiling is not None:
        right.axhline(ceiling, color="black", linestyle="--", label="each fact's own message")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), fontsize=8)
    right.set_xticks(list(x), names, fontsize=8)
    right.set(ylim=(0, 1.02), ylabel="answer accuracy", title="What the model still answers")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path
