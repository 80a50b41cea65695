"""Intervals, paired comparisons and verdicts: the one statistics module every layer uses.

- A proportion (k successes of n) gets the Wilson score interval (Wilson, 1927; method 3 of
  Newcombe, 1998): it stays inside [0, 1], does not collapse to zero width at 0/n or n/n,
  and covers close to 95 % even for the small n a workshop run has.
- A mean of per-item scores in [0, 1] that are not all 0 or 1 (recall@k when a question has
  several evidence items, citation precision) gets a percentile bootstrap interval of the mean.
- Two settings over the SAME items (the same questions at k = 2 and k = 8, the same facts
  under two strategies) are compared paired: a percentile bootstrap of the mean per-item
  difference, resampling items (so the pairing is kept), gives the interval of the change;
  for 0/1 outcomes the exact McNemar test (a two-sided binomial test on the discordant pairs)
  is reported beside it as a p-value. The bootstrap is the one that decides, because it
  gives an interval (which a tolerance can be read against) and works for fractional scores
  as well as 0/1; McNemar is exact where the bootstrap is approximate, and the two agree on
  which side of zero a clear change lies.
- A median or percentile of latencies gets a percentile bootstrap interval; two samples'
  medians are compared by a bootstrap of the difference (paired when the samples are the
  same items measured twice, otherwise each sample resampled on its own).
- A verdict on a predicted direction is `held` only when the whole interval of the change is
  past the tolerance in the predicted direction, `failed` when it lies wholly on the wrong
  side, and `within noise` otherwise (the interval includes zero or the tolerance).

Every bootstrap is seeded (`random.Random(seed)`, pure Python), so the same data and seed give
the same interval on any CPU. Nothing here imports numpy or torch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

Z95 = 1.959963984540054  # the 97.5th percentile of the standard normal
RESAMPLES = 2000
SEED = 0

VerdictKind = Literal["held", "failed", "within noise"]
Direction = Literal["up", "down", "unchanged"]


@dataclass(frozen=True)
class Interval:
    """A point estimate with its 95 % interval and the sample size it came from."""

    value: float
    low: float
    high: float
    n: int
    method: str  # "wilson", "bootstrap", "exact" (no sampling noise), "none" (n = 0)

    def includes(self, x: float) -> bool:
        return self.low <= x <= self.high

    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def to_json(self, digits: int = 4) -> dict[str, float | int | str | None]:
        def r(x: float) -> float | None:
            return round(x, digits) if math.isfinite(x) else None

        return {
            "value": r(self.value),
            "low": r(self.low),
            "high": r(self.high),
            "n": self.n,
            "method": self.method,
        }

    def pct(self, digits: int = 1) -> str:
        """e.g. '50.0 % [30.6, 69.4] (n = 16)' for a proportion."""
        if self.n == 0 or not math.isfinite(self.value):
            return "n/a (n = 0)"
        return (
            f"{100 * self.value:.{digits}f} % [{100 * self.low:.{digits}f}, "
            f"{100 * self.high:.{digits}f}] (n = {self.n})"
        )

    def text(self, digits: int = 2, unit: str = "") -> str:
        """e.g. '12.30 ms [11.90, 13.10] (n = 8)'."""
        if self.n == 0 or not math.isfinite(self.value):
            return "n/a (n = 0)"
        u = f" {unit}" if unit else ""
        return (
            f"{self.value:.{digits}f}{u} [{self.low:.{digits}f}, {self.high:.{digits}f}] "
            f"(n = {self.n})"
        )


def wilson(successes: int, n: int, z: float = Z95) -> Interval:
    """The Wilson score interval of successes/n (95 % by default)."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return Interval(math.nan, 0.0, 1.0, 0, "none")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(p, low, high, n, "wilson")


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation between closest ranks."""
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation; the engine's metrics use it too."""
    if not values:
        return math.nan
    return _quantile(sorted(values), q / 100.0)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def bootstrap(
    values: Sequence[float],
    statistic: Callable[[Sequence[float]], float],
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = 0.95,
) -> Interval:
    """Percentile bootstrap interval of `statistic` over `values` (resampled with replacement)."""
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "none")
    point = statistic(values)
    if n == 1 or min(values) == max(values):
        return Interval(point, point, point, n, "bootstrap")
    rng = random.Random(seed)
    xs = list(values)
    stats = sorted(statistic([xs[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1 - level) / 2
    return Interval(point, _quantile(stats, tail), _quantile(stats, 1 - tail), n, "bootstrap")


def median_interval(values: Sequence[float], seed: int = SEED) -> Interval:
    return bootstrap(values, median, seed=seed)


def percentile_interval(values: Sequence[float], q: float, seed: int = SEED) -> Interval:
    return bootstrap(values, lambda xs: percentile(xs, q), seed=seed)


def mean_interval(scores: Sequence[float], seed: int = SEED) -> Interval:
    """A mean of per-item scores in [0, 1]: Wilson when every score is 0 or 1, else bootstrap."""
    if all(s in (0, 1) for s in scores):
        return wilson(int(sum(scores)), len(scores))
    return bootstrap(scores, _mean, seed=seed)


def proportion(flags: Sequence[bool]) -> Interval:
    return wilson(sum(bool(f) for f in flags), len(flags))


@dataclass(frozen=True)
class Paired:
    """The change from `a` to `b` over the same items: mean(b - a) with its interval."""

    change: Interval
    a_better: int  # items where a scored higher
    b_better: int
    mcnemar_p: float | None  # exact McNemar p-value, for 0/1 outcomes only

    def to_json(self, digits: int = 4) -> dict[str, object]:
        return {
            "change": self.change.to_json(digits),
            "a_better": self.a_better,
            "b_better": self.b_better,
            "mcnemar_p": None if self.mcnemar_p is None else round(self.mcnemar_p, 6),
        }


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (binomial, p = 1/2)."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    k = min(a_only, b_only)
    tail = sum(Fraction(math.comb(n, i)) for i in range(k + 1)) / Fraction(2**n)
    return float(min(Fraction(1), 2 * tail))


def paired(a: Sequence[float], b: Sequence[float], seed: int = SEED) -> Paired:
    """Paired comparison of two scores per item (same items, same order)."""
    if len(a) != len(b):
        raise ValueError(f"paired samples need the same items, got {len(a)} and {len(b)}")
    diffs = [float(y) - float(x) for x, y in zip(a, b, strict=True)]
    change = bootstrap(diffs, _mean, seed=seed) if diffs else bootstrap([], _mean)
    a_better = sum(d < 0 for d in diffs)
    b_better = sum(d > 0 for d in diffs)
    binary = all(x in (0, 1) for x in (*a, *b))
    return Paired(change, a_better, b_better, mcnemar_exact(a_better, b_better) if binary else None)


def median_difference(
    a: Sequence[float], b: Sequence[float], paired_items: bool = False, seed: int = SEED
) -> Interval:
    """Interval of median(b) - median(a) by bootstrap (paired resamples items together)."""
    return percentile_difference(a, b, 50.0, paired_items, seed)


def percentile_difference(
    a: Sequence[float],
    b: Sequence[float],
    q: float,
    paired_items: bool = False,
    seed: int = SEED,
) -> Interval:
    """Interval of percentile(b, q) - percentile(a, q) by bootstrap (q in 0..100; paired
    resamples items together, otherwise each sample is resampled on its own)."""
    if not a or not b:
        return Interval(math.nan, math.nan, math.nan, 0, "none")
    point = percentile(b, q) - percentile(a, q)
    if paired_items:
        if len(a) != len(b):
            raise ValueError("paired samples need the same items")
        pairs = list(zip(a, b, strict=True))
        rng, n = random.Random(seed), len(pairs)
        stats = []
        for _ in range(RESAMPLES):
            draw = [pairs[rng.randrange(n)] for _ in range(n)]
            stats.append(percentile([y for _, y in draw], q) - percentile([x for x, _ in draw], q))
    else:
        rng = random.Random(seed)
        stats = []
        for _ in range(RESAMPLES):
            ra = [a[rng.randrange(len(a))] for _ in a]
            rb = [b[rng.randrange(len(b))] for _ in b]
            stats.append(percentile(rb, q) - percentile(ra, q))
    stats.sort()
    return Interval(
        point, _quantile(stats, 0.025), _quantile(stats, 0.975), min(len(a), len(b)), "bootstrap"
    )


def exact(value: float, n: int = 1) -> Interval:
    """A figure with no sampling noise (bytes, counts computed exactly): a zero-width interval."""
    return Interval(value, value, value, n, "exact")


def verdict(change: Interval, direction: Direction, tolerance: float = 0.0) -> VerdictKind:
    """Held, failed or within noise for a predicted direction, given the change's interval.

    `tolerance` (>= 0, in the change's unit) is the smallest change that counts. `up` holds
    when the whole interval lies above +tolerance and fails when it lies wholly below zero
    or wholly between zero and the tolerance (an exact change fails whenever it does not
    hold); `down` mirrors it; `unchanged` holds when the whole interval lies inside
    [-tolerance, +tolerance] and fails when it lies wholly outside. Anything else, an
    interval that includes zero or the tolerance, is within noise.
    """
    if tolerance < 0:
        raise ValueError("tolerance must be at least 0")
    lo, hi = change.low, change.high
    if direction == "unchanged":
        if -tolerance <= lo and hi <= tolerance:
            return "held"
        if lo > tolerance or hi < -tolerance:
            return "failed"
        return "within noise"
    if direction == "down":
        lo, hi = -hi, -lo
    if lo > tolerance:
        return "held"
    if hi < 0 or (lo > 0 and hi < tolerance) or (change.method == "exact" and lo == hi):
        return "failed"
    return "within noise"
