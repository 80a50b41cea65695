"""Recursive summarization: the evicted messages plus the previous summary become the new
summary, so everything ever evicted is folded into one bounded note.

The summarizer is the model itself (`summary`), or, for models too small to summarise,
an extractive one that keeps the most informative sentences verbatim
(`summary-extractive`); the note says which wrote it.
"""

from __future__ import annotations

from ctxlab.memory.context import ContextState
from ctxlab.memory.messages import Message
from ctxlab.memory.strategies.base import Strategy, StrategyEnv
from ctxlab.memory.summarizers import Summarizer

NOTE_OVERHEAD = 32  # tokens of the note's heading line


class RecursiveSummary(Strategy):
    name = "summary"
    description = "the model rewrites the evicted turns and the previous summary as one summary"

    def __init__(self, summarizer: Summarizer, summary_tokens: int = 96) -> None:
        self.summarizer = summarizer
        self.summary_tokens = summary_tokens
        self.note_budget = summary_tokens + NOTE_OVERHEAD
        self.summary = ""
        self.summarized = 0

    def on_evict(self, evicted: list[Message], state: ContextState, env: StrategyEnv) -> None:
        self.summary = self.summarizer.summarize(
            self.summary, evicted, self.summary_tokens, env.backend
        )
        self.summarized += len(evicted)
        state.note = (
            f"Summary of the {self.summarized} earlier messages ({self.summarizer.label}):\n"
            f"{self.summary}"
        )


class ExtractiveSummary(RecursiveSummary):
    name = "summary-extractive"
    description = "extractive summary (sentences kept verbatim), for models too small to summarise"
