"""RULER's string-match scores and the effective context length derived from them.

"all" is the percentage of references found in the prediction, "part" is 100 when any one is
found; both case-insensitive. The effective length is the point past which the configured
context stops being useful context: the longest tested length at which this and every shorter
length still score at or above a threshold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ctxlab.eval.sample import Metric

RULER_THRESHOLD = 85.6  # Llama-2-7B's mean RULER score at 4K, RULER's bar for "effective"


def string_match(prediction: str, references: Sequence[str], metric: Metric) -> float:
    if not references:
        raise ValueError("a sample needs at least one reference")
    pred = prediction.lower()
    found = [ref.lower() in pred for ref in references]
    if metric == "all":
        return 100.0 * sum(found) / len(found)
    return 100.0 if any(found) else 0.0


@dataclass(frozen=True)
class EffectiveLength:
    length: int | None  # None: not even the shortest length passed
    threshold: float
    basis: Literal["absolute", "relative"]
    explanation: str


def effective_length(
    mean_score_by_length: Mapping[int, float],
    threshold: float = RULER_THRESHOLD,
    relative_to: float | None = None,
) -> EffectiveLength:
    """Longest length whose score, and every shorter length's, is >= the threshold.

    With `relative_to` (the same model's full-cache score at the shortest length) the
    threshold is that fraction of it, e.g. threshold 0.9 and relative_to 80 -> 72 points.
    """
    if relative_to is not None:
        bar = threshold * relative_to
        basis: Literal["absolute", "relative"] = "relative"
        how = f"{threshold:.0%} of the full-cache score {relative_to:.1f} at the shortest length"
    else:
        bar, basis, how = threshold, "absolute", f"absolute threshold {threshold:.1f}"
    best: int | None = None
    for length in sorted(mean_score_by_length):
        if mean_score_by_length[length] < bar:
            break
        best = length
    said = "no tested length" if best is None else f"{best} tokens"
    return EffectiveLength(best, bar, basis, f"effective length {said} ({how}, bar {bar:.1f})")
