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
    length: int | None  # None: no tested length is established
    threshold: float
    basis: Literal["absolute", "relative"]
    explanation: str
    established: bool = True  # False: the next length's mean clears the bar, its interval not

    @property
    def shown(self) -> str:
        """The table's cell: the length, "none", or "not established at this n"."""
        if self.length is not None:
            return f"{self.length:,}" + ("" if self.established else " (longer: not established)")
        return "none" if self.established else "not established at this n"


def effective_length(
    mean_score_by_length: Mapping[int, float],
    threshold: float = RULER_THRESHOLD,
    relative_to: float | None = None,
    low_by_length: Mapping[int, float] | None = None,
) -> EffectiveLength:
    """Longest length at which this and every shorter length clear the bar.

    With `low_by_length` (the lower end of each length's 95 % interval), a length is
    established only when its interval clears the bar, not its mean alone: one sample that
    scored 100 has the interval [20.7, 100], which says nothing about 85.6. A mean that clears
    the bar with an interval that does not stops the walk with "not established at this n"
    (more samples decide), which is not the same verdict as a score under the bar.

    With `relative_to` (the same model's full-cache score at the shortest length) the bar is
    that fraction of it, e.g. threshold 0.9 and relative_to 80 -> 72 points.
    """
    if relative_to is not None:
        bar = threshold * relative_to
        basis: Literal["absolute", "relative"] = "relative"
        how = (
            f"bar {bar:.1f} = {threshold:.0%} of the full-cache score {relative_to:.1f} at the "
            "shortest length"
        )
    else:
        bar, basis = threshold, "absolute"
        source = (
            "RULER's bar: Llama-2-7B's mean score at 4K"
            if threshold == RULER_THRESHOLD
            else "the threshold given"
        )
        how = f"bar {bar:.1f}, {source}"
    best: int | None = None
    unsure: int | None = None
    for length in sorted(mean_score_by_length):
        if mean_score_by_length[length] < bar:
            break
        low = None if low_by_length is None else low_by_length.get(length)
        if low is not None and low < bar:
            unsure = length
            break
        best = length
    said = "no tested length" if best is None else f"{best} tokens"
    if unsure is not None:
        assert low_by_length is not None
        said += (
            f"; {unsure} tokens not established at this n (mean "
            f"{mean_score_by_length[unsure]:.1f}, but its 95 % interval starts at "
            f"{low_by_length[unsure]:.1f}, under the bar: more samples decide)"
        )
    elif best is not None and low_by_length is not None:
        said += " (the 95 % interval of every length up to it clears the bar)"
    return EffectiveLength(
        best, bar, basis, f"effective length {said}; {how}", established=unsure is None
    )
