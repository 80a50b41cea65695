"""Context strategies by name; registering one here is all a new strategy file needs."""

from __future__ import annotations

from collections.abc import Callable

from ctxlab.errors import CtxlabError
from ctxlab.memory.strategies.base import Strategy, StrategyEnv
from ctxlab.memory.strategies.compact import CompactSummary
from ctxlab.memory.strategies.summary import ExtractiveSummary, RecursiveSummary
from ctxlab.memory.strategies.tiered import TieredMemory
from ctxlab.memory.strategies.truncation import Truncation
from ctxlab.memory.summarizers import ExtractiveSummarizer, ModelSummarizer

STRATEGIES: dict[str, Callable[[], Strategy]] = {
    Truncation.name: Truncation,
    RecursiveSummary.name: lambda: RecursiveSummary(ModelSummarizer()),
    ExtractiveSummary.name: lambda: ExtractiveSummary(ExtractiveSummarizer()),
    TieredMemory.name: TieredMemory,
    CompactSummary.name: lambda: CompactSummary(ModelSummarizer()),
}
DESCRIPTIONS: dict[str, str] = {
    cls.name: cls.description
    for cls in (Truncation, RecursiveSummary, ExtractiveSummary, TieredMemory, CompactSummary)
}


def make_strategy(name: str) -> Strategy:
    """A fresh strategy object (strategies keep per-conversation state)."""
    if name not in STRATEGIES:
        raise CtxlabError(f"strategy {name!r} is unknown; use one of {', '.join(STRATEGIES)}.")
    return STRATEGIES[name]()


__all__ = ["DESCRIPTIONS", "STRATEGIES", "Strategy", "StrategyEnv", "make_strategy"]
