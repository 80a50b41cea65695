"""`keydiff`: keep the keys least like the others.

Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference
in Resource-Constrained Environments" (2025, arXiv:2504.15364). The paper observes that keys
which differ most from the rest tend to be the ones attention needs, and, like KNorm, scores
without any attention (so it works with fused kernels): per KV head, the anchor is the mean
of the lane's unit-normalised keys and a key's score is its negated cosine similarity to
that anchor; the top-k over the budget stay. No sinks and no recent window are forced. Run
once after prefill; optionally re-run during decode whenever a lane has grown `rerun_every`
tokens past the budget. (The worked example of docs/adding-a-policy.md.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ctxlab.policy.base import PromptEndCut, ScorerPolicy
from ctxlab.policy.observation import LayerView


@dataclass
class KeyDiffPolicy(PromptEndCut, ScorerPolicy):
    """Per-KV-head top-k by negated cosine similarity to the lane's mean key direction."""

    name: ClassVar[str] = "keydiff"
    paper: ClassVar[str] = "KeyDiff: key similarity (Park et al., 2025)"
    needs: ClassVar[frozenset[str]] = frozenset({"keys"})
    rerun_every: int | None = None

    def score(self, obs: LayerView) -> torch.Tensor:
        unit = F.normalize(obs.need("keys").float(), dim=-1)  # [n_kv, L, d]
        valid = obs.valid[..., None]
        anchor = (unit * valid).sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp(min=1)
        return -F.cosine_similarity(unit, anchor, dim=-1)
