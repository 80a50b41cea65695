"""`streaming`: StreamingLLM, attention sinks plus a recent window.

Xiao et al., "Efficient Streaming Language Models with Attention Sinks" (ICLR 2024,
arXiv:2309.17453). Parameters copied: 4 initial "sink" tokens kept forever, the rest of the
budget a window of the most recent tokens, and positions assigned by cache slot rather
than by original text position (so generation can run past the trained length); the
original-position variant is kept for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.errors import CtxlabError
from ctxlab.policy.base import PositionMode, ScorerPolicy
from ctxlab.policy.observation import LayerView


@dataclass
class StreamingPolicy(ScorerPolicy):
    """Keep positions < n_sinks and the last `budget - n_sinks` positions."""

    name: ClassVar[str] = "streaming"
    paper: ClassVar[str] = "StreamingLLM: attention sinks (Xiao et al., 2024)"
    sinks: int = 4
    position_mode: PositionMode = "cache-slot"

    def n_sinks(self) -> int:
        return self.sinks

    def n_recent(self, lane_budget: int) -> int:
        return max(0, lane_budget - self.sinks)

    def check_budget(self, lane_budget: int) -> None:
        # The sinks and at least one recent token must fit.
        super().check_budget(lane_budget)
        if lane_budget <= self.sinks:
            raise CtxlabError(
                f"a budget of {lane_budget} tokens is too small for streaming: its {self.sinks} "
                "sink tokens need at least one recent token beside them."
            )

    def score(self, obs: LayerView) -> torch.Tensor:
        return obs.positions.float()
