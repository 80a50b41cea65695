"""Two panels: recall@k per retriever beside answer accuracy per setting, so retrieval and
task quality are seen apart (the gold-passage bar is the model's ceiling). Error bars are
the 95 % intervals of `ctxlab.stats`. matplotlib is
imported inside the function (Agg backend)."""

from __future__ import annotations

from pathlib import Path

from ctxlab.outputs import save_figure
from ctxlab.rag.report import EvalReport


def _yerr(points: list[tuple[float, float | None, float | None]]) -> list[list[float]]:
    """matplotlib's [below, above] error lengths from (value, low, high); 0 where unknown."""
    below = [v - lo if lo is not None else 0.0 for v, lo, _ in points]
    above = [hi - v if hi is not None else 0.0 for v, _, hi in points]
    return [below, above]


def plot_eval(report: EvalReport, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name in dict.fromkeys(r.retriever for r in report.retrieval):
        rows = [r for r in report.retrieval if r.retriever == name]
        left.errorbar(
            [r.k for r in rows],
            [r.recall for r in rows],
            yerr=_yerr([(r.recall, r.recall_low, r.recall_high) for r in rows]),
            marker="o",
            capsize=3,
            label=name,
        )
    left.set(
        xlabel="k (passages retrieved)",
        ylabel="recall@k",
        ylim=(0, 1.02),
        title="Retrieval: evidence found",
    )
    left.set_xscale("log", base=2)
    ks = sorted({r.k for r in report.retrieval})
    left.set_xticks(ks, [str(k) for k in ks])
    left.legend()
    left.grid(alpha=0.3)
    if report.task:
        names = [t.setting for t in report.task]
        bars = right.bar(
            names,
            [t.accuracy for t in report.task],
            yerr=_yerr([(t.accuracy, t.accuracy_low, t.accuracy_high) for t in report.task]),
            capsize=4,
            color="tab:gray",
        )
        right.bar_label(bars, labels=[f"{t.accuracy:.0%}" for t in report.task])
        right.set(ylim=(0, 1.02), ylabel="answer accuracy", title="Task: answers right")
        right.tick_params(axis="x", labelrotation=20)
    else:
        right.set_axis_off()
    fig.suptitle(
        f"{report.settings.get('model', '')}: {report.settings.get('questions')} questions "
        "(bars: 95 % intervals)"
    )
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path
