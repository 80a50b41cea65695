"""Compaction as chat products do it: the summary replaces the history and the log is gone.

The evicted turns are folded into the recursive summary (as `summary`), and then deleted
from recall memory too, so nothing outside the summary can bring them back. Beside the
strategies that keep a searchable log, this is the one that can really lose a fact: a fact
the summary left out cannot be reconstructed by any search.
"""

from __future__ import annotations

from ctxlab.memory.context import ContextState
from ctxlab.memory.messages import Message
from ctxlab.memory.strategies.base import StrategyEnv
from ctxlab.memory.strategies.summary import RecursiveSummary


class CompactSummary(RecursiveSummary):
    name = "compact"
    description = "the model's summary replaces the evicted turns, which are deleted from the log"
    keeps_log = False

    def on_evict(self, evicted: list[Message], state: ContextState, env: StrategyEnv) -> None:
        super().on_evict(evicted, state, env)
        env.recall.forget([m.id for m in evicted if m.id is not None])
