"""What one demonstration hands back: tables by layer, observations, figures, gains, notes.

Every number the report prints comes from here, stored in the unit it is printed in (ms, not
s; MiB where a column says MiB), so results.json holds each printed number as it reads. Prose
never formats a number itself: it asks `Figures.say(name, value, digits)`, which records the
value under a name and returns its printed form, so a sentence's numbers are in results.json
too. Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from ctxlab import stats
from ctxlab.stats import Interval

# What results.json holds: the report, the checklist and the plots read these back.
JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject = dict[str, JSONValue]
Cell = str | int | float | None  # one cell of a table

Layer = Literal["storage", "serving", "retrieval", "task", "cost"]
Mode = Literal["measured", "modeled", "measured and modeled"]
Status = Literal["run", "not selected", "not measurable", "interrupted"]

# The report's five result tables and the layer of the stack each belongs to.
LAYERS: dict[str, str] = {
    "storage": "representation and allocation (ctxlab/arch, ctxlab/plan, ctxlab/kv)",
    "serving": "execution and serving (ctxlab/engine, ctxlab/sim)",
    "retrieval": "application: retrieval (ctxlab/rag)",
    "task": "model use (ctxlab/eval) and application memory (ctxlab/memory)",
    "cost": "cost (ctxlab/plan/cost.py over measured token counts and times)",
}


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def fmt(value: object, digits: int = 0) -> str:
    """The printed form of a number: thousands separators, `digits` decimals for floats."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, bool) or not is_number(value):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


@dataclass
class Column:
    name: str
    digits: int = 0  # decimals printed for float cells


@dataclass
class Table:
    key: str
    layer: Layer
    title: str
    mode: Mode
    columns: list[Column]
    rows: list[list[Cell]] = field(default_factory=list)
    note: str = ""

    def add(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(
                f"table {self.key}: {len(cells)} cells for {len(self.columns)} columns"
            )
        self.rows.append([_clean(c) for c in cells])


V = TypeVar("V")


def _clean(value: V) -> V | None:
    """NaN and inf are not JSON: they become None (printed n/a)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass
class Observation:
    """One metric of the catalogue: its baseline and observed values, in `unit`."""

    metric: str
    baseline: float | int | None
    observed: float | int | None
    digits: int = 0
    noise: float | None = None  # relative spread of the repeated baseline, when repeated
    why_missing: str | None = None  # when a value could not be measured: why
    # 95 % interval of (observed - baseline) where both come from samples (ctxlab.stats):
    # a bootstrap of the median difference for latencies, a paired bootstrap for the same
    # questions or facts measured twice. None: an exact figure, or only `noise` is known.
    change_low: float | None = None
    change_high: float | None = None
    samples: int | None = None  # the sample size the interval comes from
    test: str | None = None  # how the interval was made, in words

    @property
    def measurable(self) -> bool:
        return all(is_number(v) and math.isfinite(v) for v in (self.baseline, self.observed))


class Figures:
    """Named numbers the prose uses; `say` records one and returns it as printed."""

    def __init__(self) -> None:
        self.values: JSONObject = {}

    def say(self, name: str, value: JSONValue, digits: int = 0) -> str:
        self.values[name] = _clean(value)
        return fmt(value, digits)


@dataclass
class Gain:
    """A gain (or a loss) explained twice; None where this run cannot make the case."""

    what: str
    storage: str | None
    product: str | None


class Declared(Protocol):
    """What a result needs of its demonstration's declaration (`Demonstration` has it)."""

    @property
    def number(self) -> int: ...
    @property
    def key(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def metric_names(self) -> tuple[str, ...]: ...


@dataclass
class DemoResult:
    number: int
    key: str
    title: str
    status: Status
    mode: str = "measured"  # measured, modeled, or "measured and modeled"
    summary: str = ""
    tables: list[Table] = field(default_factory=list)
    observations: dict[str, Observation] = field(default_factory=dict)
    figures: Figures = field(default_factory=Figures)
    gains: list[Gain] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    declared: tuple[str, ...] | None = None  # the metric names `observe` accepts

    @classmethod
    def of(cls, demo: Declared, status: Status = "run", mode: str = "measured") -> DemoResult:
        """A result of `demo`: it accepts only the metrics `demo` declares."""
        return cls(demo.number, demo.key, demo.title, status, mode, declared=demo.metric_names)

    def observe(
        self,
        metric: str,
        baseline: float | None,
        observed: float | None,
        digits: int = 0,
        noise: float | None = None,
        why_missing: str | None = None,
        change: Interval | None = None,
        test: str | None = None,
    ) -> None:
        """Record a metric; `change` is the 95 % interval of observed - baseline, when the
        two come from samples (`test` says how it was made)."""
        if self.declared is not None and metric not in self.declared:
            raise ValueError(f"{metric!r} is not a declared metric of {self.key}")
        lo = hi = n = None
        if change is not None and math.isfinite(change.low) and math.isfinite(change.high):
            lo, hi, n = change.low, change.high, change.n
        self.observations[metric] = Observation(
            metric,
            _clean(baseline),
            _clean(observed),
            digits,
            noise,
            why_missing,
            lo,
            hi,
            n,
            test if lo is not None else None,
        )

    def observe_latency(
        self,
        metric: str,
        baseline: Sequence[float],
        observed: Sequence[float],
        digits: int = 0,
        noise: float | None = None,
        items: str = "repeats",
        paired: bool = False,
    ) -> None:
        """A latency metric: medians, and the bootstrap interval of their difference (the
        two sides independent, each resampled on its own; `paired`: the same items on both
        sides, resampled together)."""
        change = stats.median_difference(baseline, observed, paired_items=paired)
        self.observe(
            metric,
            stats.median(baseline) if baseline else math.nan,
            stats.median(observed) if observed else math.nan,
            digits,
            noise,
            change=change,
            test=f"paired bootstrap of the difference of medians, {len(baseline)} {items}"
            if paired
            else f"bootstrap of the difference of medians, {len(baseline)} and "
            f"{len(observed)} {items}",
        )

    def to_json(self, out_dir: Path) -> JSONObject:
        return {
            "number": self.number,
            "key": self.key,
            "title": self.title,
            "status": self.status,
            "mode": self.mode,
            "summary": self.summary,
            "wall_s": round(self.wall_s, 1),
            "cpu_s": round(self.cpu_s, 1),
            "tables": [asdict(t) for t in self.tables],
            "observations": {k: asdict(o) for k, o in self.observations.items()},
            "figures": self.figures.values,
            "gains": [asdict(g) for g in self.gains],
            "notes": self.notes,
            "plots": [str(p.relative_to(out_dir)) for p in self.plots],
        }
