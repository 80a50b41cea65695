"""The one interface every context strategy implements; a new strategy is one new file.

The agent decides when and where to cut (pressure thresholds, turn boundaries); a strategy
decides what becomes of the evicted messages (dropped, summarised, moved to recall memory
with a note) and what, if anything, comes back at a user turn. `note_budget` is the most
tokens its note may take, so the agent can leave room for it when choosing the cut.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from ctxlab.memory.backend import Backend
from ctxlab.memory.budget import MemoryConfig
from ctxlab.memory.context import ContextState
from ctxlab.memory.messages import Message
from ctxlab.memory.recall import RecallMemory


@dataclass
class StrategyEnv:
    """What a strategy may use: the model, recall memory and the budget settings."""

    backend: Backend
    recall: RecallMemory
    config: MemoryConfig
    retriever: str = "hybrid"


class Strategy(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    keeps_log: ClassVar[bool] = True  # False: evicted messages are deleted from recall memory
    note_budget: int = 0

    @abstractmethod
    def on_evict(self, evicted: list[Message], state: ContextState, env: StrategyEnv) -> None:
        """Messages just left the context (oldest first); update `state.note` if needed."""

    def on_user_turn(self, query: str, state: ContextState, env: StrategyEnv) -> list[Message]:
        """Messages to bring back for this user turn (most relevant first); none by default."""
        return []
