"""`tova`: Token Omission Via Attention.

Oren et al., "Transformers are Multi-State RNNs" (2024, arXiv:2401.06104). Parameters
copied: at every step the token with the lowest attention from the current query is
dropped once the cache is over budget; the score is that step's attention averaged over
all heads of the layer (the paper's default), so every KV head of a layer keeps the same
tokens. At the end of prefill the last prompt token plays the current query. With the
engine's default per-block schedule a lane is cut once it is a block (less one token) over
budget, dropping the lowest-attention tokens of that step's query down to the budget;
`slack=0` is the paper's one-token-per-step schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.policy.base import ScorerPolicy
from ctxlab.policy.observation import LayerView, group_reduce


@dataclass
class TOVAPolicy(ScorerPolicy):
    """Score = the current query's attention, head-averaged (or per KV head)."""

    name: ClassVar[str] = "tova"
    paper: ClassVar[str] = "TOVA: Transformers are Multi-State RNNs (Oren et al., 2024)"
    needs: ClassVar[frozenset[str]] = frozenset({"obs_attn", "step_attn"})
    per_head: bool = False
    obs_window: int = 1

    def query_window(self) -> int:
        return max(1, self.obs_window)

    def score(self, obs: LayerView) -> torch.Tensor:
        attn = obs.step_attn if obs.step_attn is not None else obs.need("obs_attn")[:, -1]
        if self.per_head:
            return group_reduce(attn.float(), obs.n_kv, "mean")
        # Attention to slot i only means "the same token" across KV heads while the lanes
        # are in lockstep, which this policy keeps them in (it keeps one set per layer).
        return attn.float().mean(dim=0, keepdim=True).expand(obs.n_kv, -1)
