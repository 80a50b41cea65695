"""The attention measurements of several prompts, summarized with intervals and plotted.

Each prompt gives one value per (layer, KV head, statistic), already averaged over its
sampled queries (`ctxlab.eval.attention`). Prompts are the independent items: the interval
is a percentile bootstrap of the mean across prompts (`ctxlab.stats`), per layer (its KV
heads averaged) and per KV head. Global and sliding layers are summarized apart, because a
sliding layer cannot see the prompt's first tokens once its window has moved past them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from ctxlab.eval.attention import STATS, PromptMeasure
from ctxlab.outputs import save_figure
from ctxlab.stats import Interval, bootstrap

LABELS = {
    "first": "first token",
    "sinks": "first k tokens",
    "oldest": "oldest k visible",
    "top1": "top 1 % keys",
    "top20": "top 20 % keys",
}


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def across(values: Sequence[float]) -> Interval:
    """Mean across prompts with its 95 % bootstrap interval (n = prompts)."""
    return bootstrap(list(values), _mean)


def summarize(
    measures: Sequence[PromptMeasure], windows: Sequence[int | None], sinks: int
) -> dict[str, object]:
    """Per layer and per KV head, each statistic's mean and interval across prompts; and the
    same over all global and all sliding layers."""
    n_layers = len(windows)
    layers = []
    for i in range(n_layers):
        n_kv = len(measures[0].values["first"][i])
        row: dict[str, object] = {
            "layer": i,
            "kind": "global" if windows[i] is None else "sliding",
            "window": windows[i],
        }
        for name in STATS:
            per_prompt = [_mean(m.values[name][i]) for m in measures]
            row[name] = across(per_prompt).to_json()
            row[f"{name}_per_kv_head"] = [
                across([m.values[name][i][h] for m in measures]).to_json() for h in range(n_kv)
            ]
        layers.append(row)
    groups = {}
    for kind in ("global", "sliding"):
        idx = [i for i in range(n_layers) if (windows[i] is None) == (kind == "global")]
        if not idx:
            continue
        groups[kind] = {
            "layers": len(idx),
            **{
                name: across(
                    [_mean([_mean(m.values[name][i]) for i in idx]) for m in measures]
                ).to_json()
                for name in STATS
            },
        }
    return {
        "prompts": len(measures),
        "prompt_tokens": measures[0].tokens,
        "queries_per_prompt": measures[0].queries,
        "query_positions": "evenly spaced over the prompt's second half",
        "sink_tokens": sinks,
        "uniform": {
            "first": _mean([m.uniform_sinks for m in measures]) / sinks,
            "sinks": _mean([m.uniform_sinks for m in measures]),
            "top1": 0.01,
            "top20": 0.20,
        },
        "by_kind": groups,
        "layers": layers,
    }


def plot_attention(doc: dict[str, object], model_label: str, path: Path) -> Path:
    """Three panels over the layers: sink mass, top-1 % and top-20 % shares; one dot per KV
    head, the layer mean with its interval across prompts, global layers shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers: list[dict] = doc["layers"]  # type: ignore[assignment]
    uniform: dict[str, float] = doc["uniform"]  # type: ignore[assignment]
    x = [row["layer"] for row in layers]
    sliding = any(row["kind"] == "sliding" for row in layers)
    # A sliding layer's window edge, the one place a sink could sit there: shown where it
    # differs from the first tokens (on global layers the two are the same keys).
    panels = (
        ("sinks", "first", "oldest") if sliding else ("sinks", "first"),
        ("top1",),
        ("top20",),
    )
    fig, axes = plt.subplots(3, 1, figsize=(8, 8.5), sharex=True)
    for ax, names in zip(axes, panels, strict=True):
        for row in layers:
            if row["kind"] == "global" and sliding:
                ax.axvspan(row["layer"] - 0.5, row["layer"] + 0.5, color="0.9", lw=0)
        for name in names:
            mean = [row[name]["value"] for row in layers]
            low = [row[name]["value"] - row[name]["low"] for row in layers]
            high = [row[name]["high"] - row[name]["value"] for row in layers]
            line = ax.errorbar(x, mean, yerr=[low, high], fmt=".-", capsize=2, label=LABELS[name])
            for row in layers:
                heads = [h["value"] for h in row[f"{name}_per_kv_head"]]
                ax.plot([row["layer"]] * len(heads), heads, "o", ms=3, alpha=0.35,
                        color=line[0].get_color())  # fmt: skip
            if name in uniform:
                ax.axhline(uniform[name], ls=":", color=line[0].get_color(), lw=1)
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("attention mass")
        ax.legend(fontsize=8, loc="upper right")
    axes[0].set_title(
        f"{model_label}: where attention goes ({doc['prompts']} prompts x "
        f"{doc['queries_per_prompt']} queries, {doc['prompt_tokens']:,} tokens; "
        f"k = {doc['sink_tokens']})",
        fontsize=10,
    )
    from matplotlib.ticker import MaxNLocator

    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlabel(
        "layer (dots: KV heads; bars: 95 % interval across prompts; dotted: uniform; "
        "shaded: global layers)",
        fontsize=8,
    )
    fig.tight_layout()
    save_figure(fig, path, "--plot", dpi=110)
    plt.close(fig)
    return path
