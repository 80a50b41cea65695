"""Tiered memory (MemGPT/Letta style): evicted messages live on in recall memory, a short
note in the prompt says so, and each user turn brings the most relevant ones back.

The default model cannot call tools, so this loop is deterministic: archive on eviction,
retrieve by the user's turn (top-k by the chosen retriever, never a message still in
context). With a tool-calling model the same memory is reachable through `tools.py`.
"""

from __future__ import annotations

from ctxlab.memory.context import ContextState
from ctxlab.memory.messages import Message
from ctxlab.memory.strategies.base import Strategy, StrategyEnv


class TieredMemory(Strategy):
    name = "tiered"
    description = "evicted turns go to recall memory; the user's turn retrieves the top-k back"
    note_budget = 64

    def __init__(self) -> None:
        self.archived = 0
        self.first = ""
        self.last = ""

    def on_evict(self, evicted: list[Message], state: ContextState, env: StrategyEnv) -> None:
        self.archived += len(evicted)
        dates = [m.created_at[:10] for m in evicted if m.created_at]
        if dates:
            self.first = self.first or min(dates)
            self.last = max([self.last, *dates]) if self.last else max(dates)
        span = f" from {self.first} to {self.last}" if self.first else ""
        state.note = (
            f"Recall memory holds {self.archived} earlier messages{span}; the ones relevant "
            "to the user's turn are recalled below it."
        )

    def on_user_turn(self, query: str, state: ContextState, env: StrategyEnv) -> list[Message]:
        if self.archived == 0 or env.config.retrieve_k == 0:
            return []
        in_context = [m.id for m in state.messages if m.id is not None]
        return env.recall.search(query, env.config.retrieve_k, env.retriever, exclude=in_context)
