"""The token budget of a context and the pressure thresholds that act on it.

budget = window - output reserve: the prompt may use every token the model accepts except
the ones kept for the reply. Pressure is the prompt's share of that budget. At
`warn_share` (default 75 %) the agent records a warning; at `compact_share` (90 %) it
evicts: first the oldest `first_evict` share of the messages (30 %), then 10 % more at a
time, until what remains fits in `target_share` (70 %), always cutting at a turn boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxlab.errors import CtxlabError

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant with a long-term memory. Use the memory below and the "
    "conversation to answer; answer briefly."
)

NOTE_POSITIONS = ("system", "turn")


@dataclass(frozen=True)
class MemoryConfig:
    window: int
    reserve: int = 128
    warn_share: float = 0.75
    compact_share: float = 0.90
    target_share: float = 0.70
    first_evict: float = 0.30
    evict_step: float = 0.10
    retrieve_k: int = 3
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    note_position: str = "system"  # or "turn": the note just before the newest user turn

    def __post_init__(self) -> None:
        if self.window <= 0:
            raise CtxlabError(f"the context window must be positive, got {self.window} tokens.")
        if self.reserve < 0 or self.reserve >= self.window:
            raise CtxlabError(
                f"the output reserve ({self.reserve} tokens) must be at least 0 and below the "
                f"window ({self.window} tokens)."
            )
        if not 0 < self.target_share < self.compact_share <= 1:
            raise CtxlabError(
                f"shares must satisfy 0 < target ({self.target_share}) < compaction "
                f"({self.compact_share}) <= 1."
            )
        if not 0 < self.warn_share <= 1:
            raise CtxlabError(f"the warning share must be in (0, 1], got {self.warn_share}.")
        if not 0 < self.first_evict <= 1 or not 0 < self.evict_step <= 1:
            raise CtxlabError("the eviction shares must be in (0, 1].")
        if self.note_position not in NOTE_POSITIONS:
            raise CtxlabError(
                f"the note position {self.note_position!r} is unknown; use system or turn."
            )
        if self.retrieve_k < 0:
            raise CtxlabError(f"retrieve_k must be at least 0, got {self.retrieve_k}.")

    @property
    def budget(self) -> int:
        """Prompt tokens allowed: the window minus the output reserve."""
        return self.window - self.reserve

    def share(self, tokens: int) -> float:
        return tokens / self.budget


@dataclass(frozen=True)
class PressureEvent:
    """A threshold crossed after a message: a warning, or a compaction and what it did."""

    kind: str  # "warning" | "compaction"
    message_index: int  # position of the message in the replayed history
    tokens_before: int
    tokens_after: int
    share_before: float
    evicted: int = 0  # messages moved out of context
    evict_share: float = 0.0  # the share of in-context messages the cut started from
