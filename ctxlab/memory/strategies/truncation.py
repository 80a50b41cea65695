"""Truncation: the oldest messages leave the context and nothing replaces them.

The baseline every other strategy must beat: it costs nothing, and what it evicts is gone
from the prompt (it stays only in recall memory, which this strategy never searches).
"""

from __future__ import annotations

from ctxlab.memory.context import ContextState
from ctxlab.memory.messages import Message
from ctxlab.memory.strategies.base import Strategy, StrategyEnv


class Truncation(Strategy):
    name = "truncation"
    description = "drop the oldest turns"

    def on_evict(self, evicted: list[Message], state: ContextState, env: StrategyEnv) -> None:
        return None
