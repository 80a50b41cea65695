"""Predictions against observations: held, failed, within noise, or not measurable.

A prediction is written before the run (`[predictions.<demo>.<metric>]` in the config); the
run measures the metric's baseline and observed values; `judge` says whether the prediction
held. A failed prediction is a result like any other: it is reported with the numbers that
failed it, never dropped. A metric that was not measured (a demonstration a server could
not run, a value that came out NaN) is "not measurable", with the reason; the predictions of
a demonstration that `--only` left out are not judged at all (the report says so).

The change (observed - baseline) is read against the run's own noise, by the rule of
`ctxlab.stats.verdict`: "held" only when the whole 95 % interval of the change is past the
tolerance in the predicted direction, "failed" when it lies wholly on the wrong side,
"within noise" when it includes zero or the tolerance. The interval comes from the samples
where the demonstration kept them (a bootstrap of the difference of medians for repeated
latencies, a paired bootstrap for the same questions or facts); where only the spread of
the repeated baseline is known, the change +- that spread stands in for it; an exact figure
(bytes, token counts) has no noise, and its verdict is held or failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ctxlab.stats import Interval, exact
from ctxlab.stats import verdict as verdict_of
from ctxlab.workshop.config import Prediction
from ctxlab.workshop.result import JSONObject, Observation, fmt

VerdictKind = Literal["held", "failed", "within noise", "not measurable"]
VERDICT_KINDS: tuple[str, ...] = ("held", "failed", "within noise", "not measurable")


@dataclass(frozen=True)
class Verdict:
    demo: int
    key: str
    metric: str
    direction: str
    tolerance: float
    range: list[float] | None
    baseline: float | int | None
    observed: float | int | None
    change_pct: float | None  # (observed - baseline) / |baseline| in percent
    noise_pct: float | None  # the baseline's spread over its repeats, when repeated
    verdict: VerdictKind
    reason: str
    digits: int = 0
    change_low: float | None = None  # the 95 % interval the verdict read, in the metric's unit
    change_high: float | None = None
    samples: int | None = None

    def to_json(self) -> JSONObject:
        return {
            "demo": self.demo,
            "key": self.key,
            "metric": self.metric,
            "direction": self.direction,
            "tolerance_pct": round(self.tolerance * 100, 1),
            "range": self.range,
            "baseline": self.baseline,
            "observed": self.observed,
            "change_pct": None if self.change_pct is None else round(self.change_pct, 1),
            "noise_pct": self.noise_pct,
            "verdict": self.verdict,
            "reason": self.reason,
            "digits": self.digits,
            "change_interval": None
            if self.change_low is None or self.change_high is None
            else [self.change_low, self.change_high],
            "samples": self.samples,
            "interval_level_pct": 95,
        }


def describe(p: Prediction) -> str:
    """The prediction in words, e.g. 'down' or 'unchanged within 25.0%; in [0, 0]'."""
    text = p.direction
    if p.tolerance:
        text += f" {'within' if p.direction == 'unchanged' else 'by more than'} "
        text += f"{fmt(p.tolerance * 100, 1)}%"
    if p.range is not None:
        text += (
            f"; in [{fmt(p.range[0], _digits(p.range[0]))}, {fmt(p.range[1], _digits(p.range[1]))}]"
        )
    return text


def _digits(x: float) -> int:
    return 0 if float(x).is_integer() else 2


def _noise_pct(obs: Observation | None) -> float | None:
    if obs is None or obs.noise is None or not math.isfinite(obs.noise):
        return None
    return round(obs.noise * 100, 1)


def judge(
    demo: int,
    key: str,
    metric: str,
    p: Prediction,
    obs: Observation | None,
    why_not: str | None = None,
) -> Verdict:
    """The verdict of one prediction on one observation (None: the metric was not measured)."""

    def make(
        kind: VerdictKind,
        reason: str,
        change: float | None = None,
        interval: tuple[float, float] | None = None,
    ) -> Verdict:
        return Verdict(
            demo,
            key,
            metric,
            p.direction,
            p.tolerance,
            p.range,
            None if obs is None else obs.baseline,
            None if obs is None else obs.observed,
            change,
            _noise_pct(obs),
            kind,
            reason,
            0 if obs is None else obs.digits,
            None if interval is None else interval[0],
            None if interval is None else interval[1],
            None if obs is None else obs.samples,
        )

    if obs is None:
        return make("not measurable", why_not or "the demonstration did not report this metric")
    if not obs.measurable:
        return make("not measurable", obs.why_missing or "a value came out undefined")
    base, seen = float(obs.baseline), float(obs.observed)  # type: ignore[arg-type]
    delta = seen - base
    if math.isnan(delta):
        return make("not measurable", "a value came out undefined")
    change = 100.0 * delta / abs(base) if base != 0 else None
    band = p.tolerance * abs(base)
    d = obs.digits
    moved = f"{fmt(obs.baseline, d)} -> {fmt(obs.observed, d)}"
    noise = _noise_pct(obs)
    if obs.change_low is not None and obs.change_high is not None:
        interval = Interval(delta, obs.change_low, obs.change_high, obs.samples or 0, "bootstrap")
        how = (
            f"95 % interval of the change [{fmt(obs.change_low, d + 1)}, "
            f"{fmt(obs.change_high, d + 1)}]" + (f" ({obs.test})" if obs.test else "")
        )
    elif noise is not None and obs.noise is not None:
        half = obs.noise * abs(base)
        interval = Interval(delta, delta - half, delta + half, 0, "spread")
        how = obs.test or (
            f"the baseline's repeats scatter by {fmt(noise, 1)}%, read as the change's noise"
        )
    else:
        interval, how = exact(delta), ""
    kind: VerdictKind = verdict_of(interval, p.direction, band)
    if p.direction == "down":
        why = (
            f"{moved}: "
            + ("fell" if delta < -band else "did not fall")
            + (" enough" if band else "")
        )
    elif p.direction == "up":
        why = (
            f"{moved}: "
            + ("rose" if delta > band else "did not rise")
            + (" enough" if band else "")
        )
    else:
        why = f"{moved}: " + ("within" if abs(delta) <= band else "outside") + " the tolerance"
    if kind == "within noise":
        why += "; the change is within the run's noise"
    if p.range is not None:
        lo, hi = p.range
        if not lo <= seen <= hi:
            why += "; outside the predicted range"
            kind = "failed"
    if how:
        why += f"; {how}"
    bounds = None if interval.method == "exact" else (interval.low, interval.high)
    return make(kind, why, change, bounds)
