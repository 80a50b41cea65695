"""`bigbird`: Longformer's local window and global tokens plus random keys.

Zaheer et al., "Big Bird: Transformers for Longer Sequences" (NeurIPS 2020,
arXiv:2007.14062). Parameters copied: local window + global tokens + `n_random` random keys
per query. Imposed at inference on a dense-trained model, for comparison. `mask(T)` is the
prefill mask (each query's random keys seeded by its position); during decode the pattern
is a retention answer with one seeded random set of earlier tokens fixed once, since an
evicted token cannot come back. A budget of B tokens is the global tokens, the random
tokens and a local window of the rest. `bigbird-prefill` applies the pattern in prefill as
well, the question's tokens global, as `longformer-prefill` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.policy.longformer import LongformerPolicy
from ctxlab.policy.observation import LayerView


def position_noise(positions: torch.Tensor, seed: int) -> torch.Tensor:
    """Deterministic values in [0, 1) per position (a multiplicative hash), seeded."""
    h = (positions.to(torch.int64) * 2654435761 + seed * 40503 + 12345) % (1 << 32)
    return h.double().div(1 << 32).float()


@dataclass
class BigBirdPolicy(LongformerPolicy):
    """Longformer's pattern plus `n_random` seeded random earlier keys per query."""

    name: ClassVar[str] = "bigbird"
    paper: ClassVar[str] = "BigBird local + global + random (Zaheer et al., 2020)"
    n_random: int = 64
    seed: int = 0

    def fixed_tokens(self) -> int:
        return super().fixed_tokens() + self.n_random

    def n_recent(self, lane_budget: int) -> int:
        return self.local

    def prefill_key(self, prompt_len: int) -> str | None:
        key = super().prefill_key(prompt_len)
        return None if key is None else f"{key}:{self.n_random}:{self.seed}"

    def _random_keys(self, query_pos: int) -> torch.Tensor:
        """Seeded picks among keys [n_global, query_pos - local] for one query position."""
        lo, hi = self.n_global, query_pos - self.local + 1
        if hi <= lo:
            return torch.empty(0, dtype=torch.int64)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + query_pos)
        perm = torch.randperm(hi - lo, generator=gen)[: self.n_random]
        return perm + lo

    def score(self, obs: LayerView) -> torch.Tensor:
        # A fixed seeded pseudo-random value per position: the top-k among the non-forced
        # tokens is then a random subset that stays the same from step to step (an evicted
        # token cannot be attended to again, so decode keeps one random set, not one per query).
        noise = position_noise(obs.positions, self.seed)
        return torch.where(self.is_question(obs.positions, obs.prompt_len), 2.0, noise)

    def pattern(self, q_pos: torch.Tensor, k_pos: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """Longformer's pattern plus each query's `n_random` seeded keys (by its position)."""
        m = super().pattern(q_pos, k_pos, prompt_len)
        first = int(k_pos[0]) if k_pos.numel() else 0
        lane_is_position = bool(torch.equal(k_pos, torch.arange(first, first + k_pos.numel())))
        for row, i in enumerate(q_pos.tolist()):
            r = self._random_keys(i)
            if not r.numel():
                continue
            if lane_is_position:  # the usual case: key j sits at column j - first
                r = r[(r >= first) & (r < first + k_pos.numel())] - first
                m[row, r] = True
            else:
                m[row] |= torch.isin(k_pos, r)
        return m


@dataclass
class BigBirdPrefillPolicy(BigBirdPolicy):
    """BigBird's pattern in prefill as well, the question's tokens global."""

    name: ClassVar[str] = "bigbird-prefill"
    paper: ClassVar[str] = "BigBird, in prefill too, question global (Zaheer et al., 2020)"
    question: int = 48  # a RULER-style question, chat-template end and answer prefix
    prefill: bool = True
