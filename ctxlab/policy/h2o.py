"""`h2o`: Heavy-Hitter Oracle, accumulated attention plus a recent window.

Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language
Models" (NeurIPS 2023, arXiv:2306.14048). Parameters copied: half of the budget for heavy
hitters (tokens with the largest attention accumulated over decode steps, per KV head here,
summed over the query heads of its GQA group), half for the most recent tokens; each step the
non-recent token with the lowest accumulated score is evicted.

The paper accumulates attention over every prompt query too; this engine seeds the scores
with the attention of the last `obs_window` prompt queries (the engine keeps only those), so
one prefill costs no O(prompt^2) matrix. The accumulator lives with the engine and moves with
compaction; the policy only reads it. During decode the engine takes each step's scores from
the decode attention itself (one read of the cache), and by default cuts a lane once per
block: when it is a block (less one token) over budget, the lowest-scoring non-recent tokens
go down to the budget; `slack=0` is the paper's one-token-per-step schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.policy.base import ScorerPolicy
from ctxlab.policy.observation import LayerView


@dataclass
class H2OPolicy(ScorerPolicy):
    """Score = accumulated attention; the recent half of the budget is always kept."""

    name: ClassVar[str] = "h2o"
    paper: ClassVar[str] = "H2O: Heavy-Hitter Oracle (Zhang et al., NeurIPS 2023)"
    needs: ClassVar[frozenset[str]] = frozenset({"acc_attn"})
    heavy_ratio: float = 0.5
    obs_window: int = 32

    def query_window(self) -> int:
        return max(1, self.obs_window)  # the prompt queries that seed the scores

    def n_recent(self, lane_budget: int) -> int:
        return lane_budget - int(lane_budget * self.heavy_ratio)

    def score(self, obs: LayerView) -> torch.Tensor:
        return obs.need("acc_attn")
