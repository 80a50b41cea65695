"""Sparse attention patterns applied at inference to a dense-trained model, for comparison.

- Longformer (Beltagy et al., 2020, arXiv:2004.05150): a local window plus a few global
  tokens that every token attends to and that attend to everything.
- BigBird (Zaheer et al., NeurIPS 2020, arXiv:2007.14062): local window + global tokens +
  a few random keys per query.

Both models were trained with these patterns; here they are imposed on a model trained
dense, which is exactly the comparison they are for. Causal versions: a query at position
i sees keys j <= i with i - j < local, or j < n_global, or i < n_global (global queries see
every earlier key), or (BigBird) j among its seeded random picks. `mask(T)` is the prefill
mask; during decode the patterns are retention answers: global + local (+ a seeded random
set of earlier tokens fixed once, since an evicted token cannot come back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ctxlab.errors import CtxlabError
from ctxlab.policy.base import LayerObs, Policy, ScorerPolicy
from ctxlab.policy.budget import Budget


def position_noise(positions: torch.Tensor, seed: int) -> torch.Tensor:
    """Deterministic values in [0, 1) per position (a multiplicative hash), seeded."""
    h = (positions.to(torch.int64) * 2654435761 + seed * 40503 + 12345) % (1 << 32)
    return h.double().div(1 << 32).float()


@dataclass
class LongformerPolicy(ScorerPolicy):
    """Local window of `local` tokens plus the first `n_global` tokens."""

    name: ClassVar[str] = "longformer"
    paper: ClassVar[str] = "Longformer local + global attention (Beltagy et al., 2020)"
    local: int = 256
    n_global: int = 4

    def __post_init__(self) -> None:
        self.budget = Budget(tokens=max(1, self.fixed_tokens() + self.local))

    def fixed_tokens(self) -> int:
        """Tokens of the budget that are not the local window."""
        return self.n_global

    @classmethod
    def from_budget(cls, budget: Budget | None = None, **params: Any) -> Policy:
        """A budget of B tokens is the global tokens plus a local window of the rest."""
        if budget is None:
            return cls(**params)
        if "local" in params:
            raise CtxlabError(f"give {cls.name} a budget or a local window, not both.")
        if budget.tokens is None:
            raise CtxlabError(
                f"{cls.name} takes its budget in tokens (its window is fixed), not as a share "
                "of the prompt."
            )
        probe = cls(local=1, **params)  # the fixed part with these parameters
        local = budget.tokens - probe.fixed_tokens()
        if local < 1:
            raise CtxlabError(
                f"a budget of {budget} tokens is too small for {cls.name}: its fixed tokens "
                f"alone take {probe.fixed_tokens()}."
            )
        return cls(local=local, **params)

    def n_sinks(self) -> int:
        return self.n_global

    def n_recent(self, lane_budget: int) -> int:
        return self.local

    def check(self) -> None:
        super().check()
        if self.local < 1 or self.n_global < 0:
            raise CtxlabError("longformer needs local >= 1 and n_global >= 0 tokens.")

    def score(self, obs: LayerObs) -> torch.Tensor:
        return torch.full_like(obs.positions, -1.0, dtype=torch.float32)

    def mask(self, length: int) -> torch.Tensor:
        """`[T, T]` bool: True where query i may attend to key j."""
        i = torch.arange(length)[:, None]
        j = torch.arange(length)[None, :]
        m = (j <= i) & ((i - j < self.local) | (j < self.n_global) | (i < self.n_global))
        return m


@dataclass
class BigBirdPolicy(LongformerPolicy):
    """Longformer's pattern plus `n_random` seeded random earlier keys per query."""

    name: ClassVar[str] = "bigbird"
    paper: ClassVar[str] = "BigBird local + global + random (Zaheer et al., 2020)"
    n_random: int = 64
    seed: int = 0

    def fixed_tokens(self) -> int:
        return self.n_global + self.n_random

    def n_recent(self, lane_budget: int) -> int:
        return self.local

    def _random_keys(self, query_pos: int, n_keys: int) -> torch.Tensor:
        """Seeded picks among keys [n_global, query_pos - local] for one query position."""
        lo, hi = self.n_global, query_pos - self.local + 1
        if hi <= lo:
            return torch.empty(0, dtype=torch.int64)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + query_pos)
        perm = torch.randperm(hi - lo, generator=gen)[: self.n_random]
        return perm + lo

    def score(self, obs: LayerObs) -> torch.Tensor:
        # A fixed seeded pseudo-random value per position: the top-k among the non-forced
        # tokens is then a random subset that stays the same from step to step (an evicted
        # token cannot be attended to again, so decode keeps one random set, not one per query).
        return position_noise(obs.positions, self.seed)

    def mask(self, length: int) -> torch.Tensor:
        m = super().mask(length)
        for i in range(self.n_global, length):
            r = self._random_keys(i, length)
            if r.numel():
                m[i, r] = True
        return m
