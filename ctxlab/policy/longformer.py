"""`longformer`: a local window plus a few global tokens, imposed on a dense-trained model.

Beltagy et al., "Longformer: The Long-Document Transformer" (2020, arXiv:2004.05150).
Parameters copied: a local window of `local` tokens every token attends to, and `n_global`
global tokens that every token attends to and that attend to everything. The model was
trained with the pattern; here it is imposed on a model trained dense, which is exactly
the comparison it is for. Causal version: a query at position i sees keys j <= i with
i - j < local, or j < n_global, or i < n_global (global queries see every earlier key).
During decode the pattern is a retention answer: the global tokens and the local window
stay, the rest is evicted. A budget of B tokens is the global tokens plus a local window of
the rest.

`longformer-prefill` applies the same pattern inside prefill as well (`prefill_mask`, which
the engine's prefill attention adds to its causal mask), with the question as global
tokens, as Longformer does for QA: the last `question` tokens of the prompt (where a
RULER-style prompt puts its question and the answer prefix) attend to every earlier key and
are kept through decode. The prompt's earlier queries see only their local window and the
first `n_global` tokens, so a needle far from the question reaches the answer only through
the question's own attention. The prompt is held whole until its end (no cut per prefill
chunk: the mask needs every earlier key in place), then cut as `longformer`. `mask(T)` is
the pattern for a T-token prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ctxlab.errors import CtxlabError
from ctxlab.policy.base import Keep, Policy, ScorerPolicy
from ctxlab.policy.budget import Budget
from ctxlab.policy.observation import LayerView


@dataclass
class LongformerPolicy(ScorerPolicy):
    """Local window of `local` tokens plus the first `n_global` tokens."""

    name: ClassVar[str] = "longformer"
    paper: ClassVar[str] = "Longformer local + global attention (Beltagy et al., 2020)"
    local: int = 256
    n_global: int = 4
    question: int = 0  # global tokens at the end of the prompt (its question)
    prefill: bool = False  # apply the pattern as a mask in prefill too

    def __post_init__(self) -> None:
        self.budget = Budget(tokens=max(1, self.fixed_tokens() + self.local))

    def fixed_tokens(self) -> int:
        """Tokens of the budget that are not the local window."""
        return self.n_global + self.question

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
        if self.local < 1 or self.n_global < 0 or self.question < 0:
            raise CtxlabError(
                f"{self.name} needs local >= 1, n_global >= 0 and question >= 0 tokens."
            )
        if self.prefill and self.question < 1:
            # a 1-token last prefill chunk runs as a decode step over every key it holds
            raise CtxlabError(
                f"{self.name} masks prefill and needs question >= 1 token: the prompt's last "
                "token may be computed over the whole cache, so it must be global."
            )

    def resident_tokens(self, prompt_len: int) -> int | None:
        return None if self.prefill else super().resident_tokens(prompt_len)

    def on_prefill(self, obs: LayerView) -> Keep | None:
        if self.prefill and obs.seq_len < obs.prompt_len:
            return None  # the mask needs every earlier key until the prompt is complete
        return super().on_prefill(obs)

    def is_question(self, positions: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """True at the prompt's last `question` positions."""
        return (positions >= prompt_len - self.question) & (positions < prompt_len)

    def is_global(self, positions: torch.Tensor, prompt_len: int) -> torch.Tensor:
        return (positions < self.n_global) | self.is_question(positions, prompt_len)

    def score(self, obs: LayerView) -> torch.Tensor:
        question = self.is_question(obs.positions, obs.prompt_len)
        return torch.where(question, 1.0, -1.0).to(torch.float32)

    def pattern(self, q_pos: torch.Tensor, k_pos: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """`[n, L]` bool: True where the query at `q_pos[i]` may attend to the key at
        `k_pos[j]` (causal, local window, global keys, global queries)."""
        i, j = q_pos[:, None], k_pos[None, :]
        seen = (i - j < self.local) | self.is_global(k_pos, prompt_len)[None, :]
        return (j <= i) & (seen | self.is_global(q_pos, prompt_len)[:, None])

    def mask(self, length: int) -> torch.Tensor:
        """`[T, T]` bool for a T-token prompt: True where query i may attend to key j."""
        pos = torch.arange(length)
        return self.pattern(pos, pos, length)

    def prefill_mask(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, prompt_len: int
    ) -> torch.Tensor | None:
        return self.pattern(q_pos, k_pos, prompt_len) if self.prefill else None

    def prefill_key(self, prompt_len: int) -> str | None:
        if not self.prefill:
            return None
        # the question's rows depend on where the prompt ends
        return f"{self.name}:{self.local}:{self.n_global}:{self.question}@{prompt_len}"


@dataclass
class LongformerPrefillPolicy(LongformerPolicy):
    """Longformer's pattern in prefill as well, the question's tokens global."""

    name: ClassVar[str] = "longformer-prefill"
    paper: ClassVar[str] = "Longformer, in prefill too, question global (Beltagy et al., 2020)"
    question: int = 48  # a RULER-style question, chat-template end and answer prefix
    prefill: bool = True
