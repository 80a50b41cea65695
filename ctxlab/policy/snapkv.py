"""`snapkv`: the observation window picks what the prefix keeps.

Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation" (2024,
arXiv:2404.14469). Parameters copied: an observation window of the last 32 prompt queries;
their attention to every earlier token is summed over the window, pooled along the key axis
(kernel 7, max pooling here), aggregated over the query heads of each KV head (GQA), and the
top-k per KV head plus the window itself are kept. Run once after prefill; optionally re-run
during decode whenever a lane has grown `rerun_every` tokens past the budget, with the last
`obs_window` decode queries as the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ctxlab.errors import CtxlabError
from ctxlab.policy.base import PromptEndCut, ScorerPolicy
from ctxlab.policy.observation import LayerView, group_reduce


def snap_scores(
    obs_attn: torch.Tensor, n_kv: int, kernel: int = 7, pool: str = "max", agg: str = "mean"
) -> torch.Tensor:
    """`[n_heads, w, L]` window attention -> `[n_kv, L]` SnapKV votes (pooled, GQA-folded)."""
    votes = obs_attn.float().sum(dim=1)  # [H, L]
    if kernel > 1:
        x = votes.unsqueeze(1)
        if pool == "max":
            x = F.max_pool1d(x, kernel, stride=1, padding=kernel // 2)
        else:
            x = F.avg_pool1d(x, kernel, stride=1, padding=kernel // 2, count_include_pad=False)
        votes = x.squeeze(1)[:, : obs_attn.shape[-1]]
    return group_reduce(votes, n_kv, agg)


@dataclass
class SnapKVPolicy(PromptEndCut, ScorerPolicy):
    """Per-KV-head top-k by pooled window votes; the window is always kept."""

    name: ClassVar[str] = "snapkv"
    paper: ClassVar[str] = "SnapKV (Li et al., 2024)"
    needs: ClassVar[frozenset[str]] = frozenset({"obs_attn"})
    obs_window: int = 32
    kernel: int = 7
    pooling: str = "max"
    rerun_every: int | None = None

    def query_window(self) -> int:
        return max(1, self.obs_window)

    def n_recent(self, lane_budget: int) -> int:
        return self.obs_window

    def check(self) -> None:
        super().check()
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise CtxlabError(f"the pooling kernel must be a positive odd size, got {self.kernel}.")
        if self.pooling not in ("max", "avg"):
            raise CtxlabError(f"pooling must be 'max' or 'avg', got {self.pooling!r}.")

    def score(self, obs: LayerView) -> torch.Tensor:
        return snap_scores(obs.need("obs_attn"), obs.n_kv, self.kernel, self.pooling)
