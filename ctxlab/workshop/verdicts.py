"""Predictions against observations: held, failed, or not measurable.

A prediction is written before the run (`[predictions.<demo>.<metric>]` in the config); the
run measures the metric's baseline and observed values; `judge` says whether the prediction
held. A failed prediction is a result like any other: it is reported with the numbers that
failed it, never dropped. A metric that was not measured (a demonstration not selected,
a value that came out NaN) is "not measurable", with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from ctxlab.workshop.config import Prediction
from ctxlab.workshop.result import Observation, fmt

VerdictKind = Literal["held", "failed", "not measurable"]


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

    def to_json(self) -> dict[str, Any]:
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

    def make(kind: VerdictKind, reason: str, change: float | None = None) -> Verdict:
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
        )

    if obs is None:
        return make("not measurable", why_not or "the demonstration did not report this metric")
    if not obs.measurable:
        return make("not measurable", obs.why_missing or "a value came out undefined")
    base, seen = float(obs.baseline), float(obs.observed)  # type: ignore[arg-type]
    delta = seen - base
    change = 100.0 * delta / abs(base) if base != 0 else None
    band = p.tolerance * abs(base)
    d = obs.digits
    moved = f"{fmt(obs.baseline, d)} -> {fmt(obs.observed, d)}"
    if p.direction == "down":
        ok = delta < -band
        why = f"{moved}: " + ("fell" if ok else "did not fall") + (" enough" if band else "")
    elif p.direction == "up":
        ok = delta > band
        why = f"{moved}: " + ("rose" if ok else "did not rise") + (" enough" if band else "")
    else:
        ok = abs(delta) <= band
        why = f"{moved}: " + ("within" if ok else "outside") + " the tolerance"
    if p.range is not None:
        lo, hi = p.range
        inside = lo <= seen <= hi
        if not inside:
            why += "; outside the predicted range"
        ok = ok and inside
    if math.isnan(delta):
        return make("not measurable", "a value came out undefined")
    noise = _noise_pct(obs)
    if noise is not None:
        why += f"; the baseline's repeats scatter by {fmt(noise, 1)}%"
    return make("held" if ok else "failed", why, change)
