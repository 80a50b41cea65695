"""ctxlab.stats against published values, exact computations and its own invariants."""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab import stats
from ctxlab.stats import Interval, exact, mcnemar_exact, paired, verdict, wilson


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        # Newcombe (1998), "Two-sided confidence intervals for the single proportion",
        # Statistics in Medicine 17:857-872, Table II, method 3 (Wilson score, no correction).
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0000, 0.1611),
        (1, 29, 0.0061, 0.1718),
        (29, 29, 0.8830, 1.0000),
    ],
)
def test_wilson_matches_newcombe_1998(k: int, n: int, low: float, high: float) -> None:
    got = wilson(k, n)
    assert got.value == pytest.approx(k / n)
    assert got.low == pytest.approx(low, abs=5e-5) and got.high == pytest.approx(high, abs=5e-5)


def test_wilson_edges_and_bad_input() -> None:
    assert wilson(0, 0).n == 0 and math.isnan(wilson(0, 0).value)
    with pytest.raises(ValueError):
        wilson(3, 2)
    # one answer of 16 is 6.25 points; the 95 % interval of 8/16 is about +-22 points
    half = wilson(8, 16)
    assert half.low == pytest.approx(0.2800, abs=1e-4) and half.high == pytest.approx(
        0.72, abs=1e-4
    )


@given(st.integers(0, 400), st.integers(1, 400))
def test_wilson_contains_the_estimate_and_mirrors(k: int, n: int) -> None:
    k = min(k, n)
    w, m = wilson(k, n), wilson(n - k, n)
    assert 0 <= w.low <= w.value <= w.high <= 1
    assert w.low == pytest.approx(1 - m.high, abs=1e-12)
    assert w.high > w.low  # never zero width, even at 0/n or n/n


def _mcnemar_by_enumeration(b: int, c: int) -> float:
    """Sum the probabilities of every split of the b + c discordant pairs at least as
    extreme as the one seen (two-sided, binomial p = 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    probs = [Fraction(math.comb(n, i), 2**n) for i in range(n + 1)]
    seen = probs[b]
    return float(min(Fraction(1), sum(p for p in probs if p <= seen)))


@pytest.mark.parametrize(("b", "c", "p"), [(0, 6, 0.03125), (1, 9, 0.021484375), (5, 5, 1.0)])
def test_mcnemar_exact_known_values(b: int, c: int, p: float) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)


@given(st.integers(0, 60), st.integers(0, 60))
def test_mcnemar_agrees_with_enumeration(b: int, c: int) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(_mcnemar_by_enumeration(b, c), rel=1e-9)


def test_paired_is_seeded_and_sees_a_clear_change() -> None:
    a = [1, 0, 1, 1, 0, 0, 1, 0] * 4
    b = [1, 1, 1, 1, 0, 1, 1, 1] * 4
    first, again = paired(a, b), paired(a, b)
    assert first == again  # same data, same seed, same interval
    assert first.change.value == pytest.approx(12 / 32)
    assert first.change.low > 0 and first.b_better == 12 and first.a_better == 0
    assert first.mcnemar_p == pytest.approx(2 / 2**12)
    assert verdict(first.change, "up") == "held"
    assert verdict(first.change, "down") == "failed"


def test_paired_one_item_is_within_noise() -> None:
    a = [1] * 15 + [0]
    b = [1] * 16  # one answer of sixteen changed: 6.25 points, not beyond noise
    p = paired(a, b)
    assert p.change.value == pytest.approx(1 / 16) and p.change.includes(0.0)
    assert verdict(p.change, "up") == "within noise"
    assert p.mcnemar_p == 1.0


def test_paired_needs_the_same_items() -> None:
    with pytest.raises(ValueError):
        paired([1, 0], [1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=60))
def test_paired_interval_contains_its_estimate(pairs: list[tuple[int, int]]) -> None:
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    p = paired(a, b)
    assert p.change.low <= p.change.value + 1e-12 and p.change.value <= p.change.high + 1e-12
    assert p.change.low >= -1 and p.change.high <= 1
    if p.mcnemar_p is not None and p.mcnemar_p < 0.001:
        assert not p.change.includes(0.0)  # the exact test and the bootstrap agree when clear


def test_median_interval_and_difference() -> None:
    xs = [10.0, 12, 11, 13, 30, 9, 10, 11]
    m = stats.median_interval(xs)
    assert m.value == 11.0 and m.low <= 11.0 <= m.high and m.n == 8
    assert stats.median_interval([5.0] * 4) == Interval(5.0, 5.0, 5.0, 4, "bootstrap")
    slow = [x + 20 for x in xs]
    d = stats.median_difference(xs, slow)
    assert d.value == 20.0 and d.low > 0
    same = stats.median_difference(xs, list(reversed(xs)))
    assert same.includes(0.0)
    p = stats.median_difference(xs, slow, paired_items=True)
    assert p.low == p.high == 20.0  # every pair moved by exactly 20


def test_percentile_interpolates_like_the_engine() -> None:
    assert stats.percentile([1.0, 2, 3, 4], 50) == 2.5
    assert stats.percentile([1.0, 2, 3, 4], 90) == pytest.approx(3.7)
    assert math.isnan(stats.percentile([], 50))


def test_mean_interval_picks_wilson_for_binary_scores() -> None:
    assert stats.mean_interval([1, 0, 1, 1]).method == "wilson"
    frac = stats.mean_interval([1, 0.5, 0, 1, 0.5])
    assert frac.method == "bootstrap" and frac.value == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("low", "high", "direction", "tol", "kind"),
    [
        (0.10, 0.30, "up", 0.0, "held"),
        (-0.05, 0.30, "up", 0.0, "within noise"),  # includes zero
        (0.02, 0.30, "up", 0.05, "within noise"),  # includes the tolerance
        (0.01, 0.03, "up", 0.05, "failed"),  # surely below the tolerance
        (-0.30, -0.10, "up", 0.0, "failed"),
        (-0.30, -0.10, "down", 0.0, "held"),
        (-0.02, 0.02, "unchanged", 0.05, "held"),
        (-0.02, 0.08, "unchanged", 0.05, "within noise"),
        (0.06, 0.08, "unchanged", 0.05, "failed"),
    ],
)
def test_verdict_rule(low: float, high: float, direction: str, tol: float, kind: str) -> None:
    change = Interval((low + high) / 2, low, high, 10, "bootstrap")
    assert verdict(change, direction, tol) == kind  # type: ignore[arg-type]


def test_an_exact_change_is_held_or_failed_never_noise() -> None:
    assert verdict(exact(0.0), "up") == "failed"
    assert verdict(exact(-3.0), "down") == "held"
    assert verdict(exact(0.04), "up", 0.05) == "failed"


def test_the_module_needs_neither_numpy_nor_torch() -> None:
    code = "import sys, ctxlab.stats; print('numpy' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_percentile_difference_reads_any_percentile_and_keeps_pairs():
    a = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0]
    b = [x + 5.0 for x in a]
    for q in (50.0, 90.0, 99.0):
        iv = stats.percentile_difference(a, b, q)
        assert iv.value == pytest.approx(5.0) and iv.n == 8
        assert iv.low <= 5.0 <= iv.high
        # paired: every item moved by exactly 5, so every resample's difference is 5
        tight = stats.percentile_difference(a, b, q, paired_items=True)
        assert (tight.low, tight.high) == pytest.approx((5.0, 5.0))
    assert stats.percentile_difference(a, b, 50.0) == stats.median_difference(a, b)
    assert stats.percentile_difference([], b, 99.0).n == 0
    # a shift far beyond the spread is held; overlapping samples are within noise
    assert verdict(stats.percentile_difference(a, [x + 50 for x in a], 99.0), "up") == "held"
    assert verdict(stats.percentile_difference(a, list(reversed(a)), 99.0), "up") == (
        "within noise"
    )
    with pytest.raises(ValueError):
        stats.percentile_difference(a, b[:3], 50.0, paired_items=True)
