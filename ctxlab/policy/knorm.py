"""`knorm`: keep the keys with the lowest L2 norm.

Devoto, Zhao, Scardapane and Minervini, "A Simple and Effective L2 Norm-Based Strategy for KV
Cache Compression" (EMNLP 2024, arXiv:2406.11430). The paper observes that a cached key with a
low L2 norm tends to receive high attention, so the score needs no attention at all (it works
with fused attention kernels): score = -||k||, per KV head, top-k over the budget. Keys are
scored as the cache holds them (after RoPE, a rotation, so the norm is the same). No sinks
and no recent window are forced, as in the paper and in kvpress's KnormPress. Run once after
prefill; optionally re-run during decode whenever a lane has grown `rerun_every` tokens past
the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.policy.base import PromptEndCut, ScorerPolicy
from ctxlab.policy.observation import LayerView


@dataclass
class KNormPolicy(PromptEndCut, ScorerPolicy):
    """Per-KV-head top-k by negated key L2 norm (lowest norms kept)."""

    name: ClassVar[str] = "knorm"
    paper: ClassVar[str] = "L2 norm of keys (Devoto et al., EMNLP 2024)"
    needs: ClassVar[frozenset[str]] = frozenset({"keys"})
    rerun_every: int | None = None

    def score(self, obs: LayerView) -> torch.Tensor:
        return -torch.linalg.vector_norm(obs.need("keys").float(), dim=-1)
