"""`longformer`: a local window plus a few global tokens, imposed on a dense-trained model.

Beltagy et al., "Longformer: The Long-Document Transformer" (2020, arXiv:2004.05150).
Parameters copied: a local window of `local` tokens every token attends to, and `n_global`
global tokens that every token attends to and that attend to everything. The model was
trained with the pattern; here it is imposed on a model trained dense, which is exactly
the comparison it is for. Causal version: a query at position i sees keys j <= i with
i - j < local, or j < n_global, or i < n_global (global queries see every earlier key).
`mask(T)` is the prefill mask; during decode the pattern is a retention answer: the global
tokens and the local window stay, the rest is evicted. A budget of B tokens is the global
tokens plus a local window of the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ctxlab.errors import CtxlabError
from ctxlab.policy.base import Policy, ScorerPolicy
from ctxlab.policy.budget import Budget
from ctxlab.policy.observation import LayerView


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

    def score(self, obs: LayerView) -> torch.Tensor:
        return torch.full_like(obs.positions, -1.0, dtype=torch.float32)

    def mask(self, length: int) -> torch.Tensor:
        """`[T, T]` bool: True where query i may attend to key j."""
        i = torch.arange(length)[:, None]
        j = torch.arange(length)[None, :]
        m = (j <= i) & ((i - j < self.local) | (j < self.n_global) | (i < self.n_global))
        return m
