"""The highest request rate that meets an SLO, read from a sweep of the trace's time scale.

A deployment question is rarely "what is p99 TTFT at this rate" but "how fast may requests
arrive before too many miss the SLO". `ctxlab simulate --sweep trace-time-scale=...` replays
the same requests offered faster or slower (arrival times x the scale); each run's
`slo_attainment` is the share of requests with TTFT and TPOT within their SLOs. The answer is
the fastest swept rate whose attainment reaches the target, and the cliff is the next faster
one, where it no longer does. Both are bounded by the grid the user swept: the true limit
lies between them, and the sentence says so. Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_ATTAINMENT = 0.9  # a run "meets the SLO" when 90 % of its requests do


@dataclass(frozen=True)
class SweptRate:
    """One run of the sweep: its label (the time scale), offered rate and attainment."""

    label: str
    rate_per_s: float
    attainment: float


@dataclass(frozen=True)
class RateAnswer:
    """The fastest swept rate meeting the target and the slower edge of the cliff."""

    target: float
    best: SweptRate | None  # None: not even the slowest swept rate meets it
    cliff: SweptRate | None  # the next faster swept rate, which misses; None: none swept misses

    def sentence(self, slo: str) -> str:
        share = f"{self.target:.0%} of requests within {slo}"
        if self.best is None:
            first = self.cliff
            assert first is not None
            return (
                f"no swept rate meets the SLO ({share}): at the slowest, {_rate(first)}, "
                f"{first.attainment:.0%} do; sweep slower rates."
            )
        met = f"{_rate(self.best)} meets it ({self.best.attainment:.0%})"
        if self.cliff is None:
            return f"the fastest swept rate, {met}, still meets the SLO ({share}); sweep faster."
        return (
            f"highest swept rate meeting the SLO ({share}): {met}; the cliff: at "
            f"{_rate(self.cliff)} only {self.cliff.attainment:.0%} do, so the limit lies "
            "between the two."
        )


def _rate(r: SweptRate) -> str:
    return f"{r.rate_per_s:.3g} requests/s (time scale {r.label})"


def highest_rate(runs: list[SweptRate], target: float = DEFAULT_ATTAINMENT) -> RateAnswer:
    """The fastest run meeting `target` before the first, slower-to-faster, that misses it.

    Runs are read from the slowest rate up; the answer stops at the first miss, so a rate
    that meets the SLO again past a cliff (noise in a short trace) is not reported as safe,
    and of two runs at one rate the worse is read first."""
    if not 0 < target <= 1:
        raise ValueError(f"an SLO attainment target is a share in (0, 1], got {target}")
    ordered = sorted(runs, key=lambda r: (r.rate_per_s, _share(r)))
    best = None
    for run in ordered:
        if _share(run) < target:
            return RateAnswer(target, best, run)
        best = run
    return RateAnswer(target, best, None)


def _share(run: SweptRate) -> float:
    """Its attainment; a run with no requests to judge (NaN) meets nothing."""
    return -1.0 if math.isnan(run.attainment) else run.attainment
