"""Latency figures for the demonstrations' tables: each percentile with its n and 95 %
interval, and two samples' percentiles compared with a verdict, all by `ctxlab.stats`.

A TTFT median or p99 of a few requests carries little: demonstration 2 shows single TTFTs
scatter by tens of percent. So a table prints the figure beside the requests it came from
and its bootstrap interval, and a comparison between two rows (page 1 against page 256,
grouped against interleaved arrivals) prints the change's interval and the verdict the
prediction's direction gets from it (held, failed or within noise), the same rule the
report's verdict table applies (`ctxlab.stats.verdict`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ctxlab import stats
from ctxlab.stats import Direction, Interval
from ctxlab.workshop.config import Prediction


@dataclass(frozen=True)
class Compared:
    """percentile(observed) - percentile(baseline): its interval, verdict and how it was made."""

    change: Interval
    verdict: str  # held | failed | within noise | not measurable
    test: str

    def cells(self) -> tuple[float, float, float, str]:
        """(change, 95 % low, 95 % high, verdict) for a table row."""
        return self.change.value, self.change.low, self.change.high, self.verdict


def interval(values: Sequence[float], q: float) -> Interval:
    """The q-th percentile (0..100) of `values` with its bootstrap interval and n."""
    if not values:
        return Interval(math.nan, math.nan, math.nan, 0, "none")
    return stats.percentile_interval(list(values), q)


def cells(values: Sequence[float], q: float) -> tuple[float, float, float]:
    """(percentile, 95 % low, 95 % high) for a table row."""
    iv = interval(values, q)
    return iv.value, iv.low, iv.high


def compare(
    baseline: Sequence[float],
    observed: Sequence[float],
    q: float,
    direction: Direction,
    paired: bool = False,
    tolerance: float = 0.0,
) -> Compared:
    """Bootstrap of percentile(observed, q) - percentile(baseline, q): `paired` resamples
    the same items together (the same requests on two sides), otherwise each side on its own
    (separate repeats). The verdict reads the interval for `direction`, `tolerance` in ms."""
    name = "median" if q == 50 else f"p{q:g}"
    how = "paired over the same requests" if paired else "each side resampled on its own"
    test = (
        f"bootstrap of the difference of {name}s, {len(baseline)} and {len(observed)} values, {how}"
    )
    change = stats.percentile_difference(list(baseline), list(observed), q, paired)
    if change.n == 0 or not (math.isfinite(change.low) and math.isfinite(change.high)):
        return Compared(change, "not measurable", test)
    return Compared(change, stats.verdict(change, direction, tolerance), test)


def predicted(
    predictions: Mapping[str, Prediction], metric: str, hypothesis: Direction
) -> tuple[Direction, float]:
    """(direction, relative tolerance) of the run's prediction for `metric`, or the
    demonstration's own hypothesis with no tolerance when the config predicts nothing."""
    p = predictions.get(metric)
    return (p.direction, p.tolerance) if p is not None else (hypothesis, 0.0)
