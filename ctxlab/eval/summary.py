"""Turn per-sample result rows into the tables and plots a reader compares policies with.

Rows are the JSON lines `ctxlab eval` writes (one per sample). Quality is never shown alone:
every aggregate carries the mean resident KV bytes measured for the same rows, so a policy
that scores well by keeping everything is seen to cost what it keeps. A cell's mean score
carries its sample count and 95 % interval (`ctxlab.stats`: Wilson when every sample
scored 0 or 100, else a bootstrap of the mean), so a difference of one sample is not read
as a difference of policies.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from ctxlab import stats
from ctxlab.errors import CtxlabError
from ctxlab.eval.scoring import RULER_THRESHOLD, EffectiveLength, effective_length
from ctxlab.inputs import loads_json, read_text
from ctxlab.outputs import save_figure

Row = dict[str, object]


# What every row needs for the tables (the rest is shown when present).
_ROW_FIELDS = {"task": str, "length": int, "policy": str, "score": (int, float)}


def read_rows(path: Path) -> list[Row]:
    """The rows of a rows.jsonl, each checked; an empty file or a bad line is one sentence."""
    rows = []
    for number, line in enumerate(read_text(path, "rows file").splitlines(), start=1):
        if not line.strip():
            continue
        row = loads_json(line, f"{path}: line {number}")
        why = _row_problem(row)
        if why:
            raise CtxlabError(f"{path}: line {number} {why}; is it a rows.jsonl of ctxlab eval?")
        rows.append(row)
    if not rows:
        raise CtxlabError(f"rows file {path} holds no rows; run ctxlab eval to write one")
    return rows


def _row_problem(row: object) -> str | None:
    if not isinstance(row, dict):
        return "is not a JSON object"
    for key, kind in _ROW_FIELDS.items():
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            return f"has no valid {key!r}"
    if not 0 <= float(row["score"]) <= 100 or int(row["length"]) <= 0:
        return "has a score outside 0-100 or a length that is not positive"
    kv = row.get("resident_kv_bytes")
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int | float) or kv < 0):
        return "has a resident_kv_bytes that is not a byte count"
    return None


def kv_dtype_label(rows: Iterable[Row]) -> str:
    """How the rows' caches were stored, for plot titles ("float32", "int8, float32")."""
    kinds = sorted({str(r["kv_dtype"]) for r in rows if r.get("kv_dtype")})
    return ", ".join(kinds) if kinds else "cache dtype not recorded"


def policy_label(row: Row) -> str:
    budget = row.get("budget")
    return str(row["policy"]) if budget in (None, "") else f"{row['policy']}@{budget}"


@dataclass(frozen=True)
class Cell:
    """Mean score and cost of the rows sharing (task, length, policy)."""

    task: str
    length: int
    policy: str
    score: float
    kv_bytes: float | None
    samples: int
    score_low: float | None = None  # 95 % interval of the mean score, 0-100
    score_high: float | None = None


def score_interval(scores: Sequence[float]) -> tuple[float, float]:
    """The 95 % interval of a mean of 0-100 scores, in the same scale."""
    ci = stats.mean_interval([s / 100 for s in scores])
    return 100 * ci.low, 100 * ci.high


def _mean_bytes(rows: Sequence[Row]) -> float | None:
    values = [r["resident_kv_bytes"] for r in rows if r.get("resident_kv_bytes") is not None]
    return fmean(float(v) for v in values) if values else None  # type: ignore[arg-type]


def cells(rows: Iterable[Row]) -> list[Cell]:
    groups: dict[tuple[str, int, str], list[Row]] = defaultdict(list)
    for row in rows:
        groups[(str(row["task"]), int(row["length"]), policy_label(row))].append(row)  # type: ignore[arg-type]
    out = []
    for (task, length, policy), group in sorted(groups.items()):
        scores = [float(r["score"]) for r in group]  # type: ignore[arg-type]
        low, high = score_interval(scores)
        out.append(
            Cell(task, length, policy, fmean(scores), _mean_bytes(group), len(group), low, high)
        )
    return out


@dataclass(frozen=True)
class LengthMean:
    """One policy at one length: the mean of its task means, and of its measured KV bytes."""

    score: float
    kv_bytes: float | None
    tasks: int
    # The mean of the tasks' 95 % interval ends: wider than the interval of the mean of
    # independent task means, so a length established on it is established (conservative).
    score_low: float | None = None
    score_high: float | None = None


def length_means(rows: Iterable[Row]) -> dict[str, dict[int, LengthMean]]:
    """policy -> length -> mean over tasks (each task weighs the same, however many depths or
    samples it ran): the compact view of a grid, and what effective length is decided on."""
    groups: dict[str, dict[int, list[Cell]]] = defaultdict(lambda: defaultdict(list))
    for c in cells(rows):
        groups[c.policy][c.length].append(c)
    out: dict[str, dict[int, LengthMean]] = {}
    for policy, by_len in sorted(groups.items()):
        out[policy] = {}
        for length, group in sorted(by_len.items()):
            kv = [c.kv_bytes for c in group if c.kv_bytes is not None]
            lows = [c.score_low for c in group if c.score_low is not None]
            highs = [c.score_high for c in group if c.score_high is not None]
            whole = len(lows) == len(highs) == len(group)
            out[policy][length] = LengthMean(
                fmean(c.score for c in group),
                fmean(kv) if kv else None,
                len(group),
                fmean(lows) if whole else None,
                fmean(highs) if whole else None,
            )
    return out


def effective_lengths(
    rows: Sequence[Row], threshold: float = RULER_THRESHOLD, relative: bool = False
) -> dict[str, EffectiveLength]:
    """Per policy, over the mean of the task means at each length (each task weighs the same,
    however many depths or samples it ran).

    relative=True takes the threshold as a fraction of the full-cache policy's mean score at
    the shortest length (the report says which basis it used).
    """
    by_policy = length_means(rows)
    means = {p: {n: mean.score for n, mean in by_len.items()} for p, by_len in by_policy.items()}
    lows = {
        p: {n: mean.score_low for n, mean in by_len.items() if mean.score_low is not None}
        for p, by_len in by_policy.items()
    }
    reference = None
    if relative:
        full = next((m for p, m in means.items() if p.split("@")[0] == "full"), None)
        if full is None:
            raise CtxlabError("a relative threshold needs results of the full policy")
        reference = full[min(full)]
    return {p: effective_length(m, threshold, reference, lows[p]) for p, m in means.items()}


def plot_heatmaps(rows: Sequence[Row], out_dir: Path) -> list[Path]:
    """One depth x length heatmap PNG per policy (mean score over depth tasks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ctxlab.plan.units import short_tokens

    written = []
    by_policy: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if row.get("depth") is not None:
            by_policy[policy_label(row)].append(row)
    for policy, group in sorted(by_policy.items()):
        lengths = sorted({int(r["length"]) for r in group})  # type: ignore[arg-type]
        depths = sorted({float(r["depth"]) for r in group})  # type: ignore[arg-type]
        grid = [[float("nan")] * len(lengths) for _ in depths]
        for i, d in enumerate(depths):
            for j, n in enumerate(lengths):
                scores = [
                    float(r["score"])
                    for r in group  # type: ignore[arg-type]
                    if float(r["depth"]) == d and int(r["length"]) == n
                ]  # type: ignore[arg-type]
                if scores:
                    grid[i][j] = fmean(scores)
        fig, ax = plt.subplots(
            figsize=(max(5.0, 1.6 + 0.9 * len(lengths)), max(3.2, 1.2 + 0.35 * len(depths)))
        )
        image = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), [short_tokens(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        ax.set_xlabel("context length (tokens; K = 1,024)")
        ax.set_ylabel("needle depth")
        ax.set_title(
            f"{policy}: mean score of the depth tasks ({kv_dtype_label(group)} KV)", fontsize=10
        )
        fig.colorbar(image, ax=ax, label="score (0-100)")
        fig.tight_layout()
        path = out_dir / f"heatmap_{_slug(policy)}.png"
        save_figure(fig, path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _style(policy: str, names: list[str]) -> dict[str, object]:
    """One colour per policy name, one marker and line style per budget, so 15 series read."""
    import matplotlib

    name, _, budget = policy.partition("@")
    colours = matplotlib.colormaps["tab10"].colors
    budgets = ("", "0.25", "0.5", "0.75")
    k = budgets.index(budget) if budget in budgets else len(budgets)
    return {
        "color": colours[names.index(name) % len(colours)],
        "marker": "osD^v"[k % 5],
        "linestyle": ("-", "--", ":", "-.", "-")[k % 5],
        "label": policy,
    }


Point = tuple[float, float] | tuple[float, float, float | None, float | None]


def _score_plot(series: dict[str, list[Point]], title: str, path: Path) -> Path:
    """Score against bytes per policy; a point with its interval (x, y, low, high) draws it
    as an error bar (`ctxlab eval` cells carry their 95 % interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ctxlab.plan.plot import plain_axes

    names = sorted({p.partition("@")[0] for p in series})
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for policy, points in sorted(series.items()):
        points = sorted(points, key=lambda p: (p[0], p[1]))
        xs_, ys_ = [max(p[0], 1) for p in points], [p[1] for p in points]
        style = _style(policy, names)
        ax.plot(xs_, ys_, **style)
        if all(len(p) == 4 and p[2] is not None and p[3] is not None for p in points):
            low = [max(0.0, p[1] - p[2]) for p in points]  # type: ignore[misc, operator]
            high = [max(0.0, p[3] - p[1]) for p in points]  # type: ignore[misc, operator]
            ax.errorbar(
                xs_, ys_, yerr=[low, high], fmt="none", ecolor=style["color"], alpha=0.5, capsize=2
            )
    ax.set_xscale("log", base=2)
    xs = [max(p[0], 1) for points in series.values() for p in points]
    if xs:  # at least an octave each side, so the axis has labelled ticks
        ax.set_xlim(min(xs) / 2, max(xs) * 2)
    ax.set_ylim(-5, 105)
    plain_axes(ax, x="bytes", y=None)
    ax.set_xlabel("resident KV measured from the pool (log scale); one point per length")
    ax.set_ylabel("score (0-100)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_score_vs_bytes(rows: Sequence[Row], out_dir: Path) -> list[Path]:
    """Per task, and for the mean over tasks: score against mean resident KV bytes, one point
    per policy and length."""
    written = []
    table = [c for c in cells(rows) if c.kv_bytes is not None]
    for task in sorted({c.task for c in table}):
        series: dict[str, list[Point]] = defaultdict(list)
        for c in table:
            if c.task == task:  # with the cell's 95 % interval: an error bar
                series[c.policy].append((c.kv_bytes, c.score, c.score_low, c.score_high))  # type: ignore[arg-type]
        path = out_dir / f"score_vs_kv_{_slug(task)}.png"
        title = (
            f"{task}: quality against what it cost ({kv_dtype_label(rows)} KV; "
            "bars: 95 % intervals)"
        )
        written.append(_score_plot(series, title, path))
    means = {
        policy: [(m.kv_bytes, m.score) for m in by_len.values() if m.kv_bytes is not None]
        for policy, by_len in length_means(rows).items()
    }
    means = {p: pts for p, pts in means.items() if pts}
    if means and len({c.task for c in table}) > 1:
        path = out_dir / "score_vs_kv_all_tasks.png"
        title = f"mean over tasks: quality against what it cost ({kv_dtype_label(rows)} KV)"
        written.append(_score_plot(means, title, path))  # type: ignore[arg-type]
    return written


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text)
