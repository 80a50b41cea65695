"""`recall`: a far tier for evicted blocks, and bringing the best ones back.

Eviction is usually final. Here a base eviction policy (H2O, StreamingLLM, ...), wrapped,
decides what leaves the near tier (the pool); the engine sends the evicted tokens of each
lane, a block of `block` tokens at a time, to a far tier (host memory or a file on disk)
together with a Quest-style summary (per-channel key min and max). Every `every` decode
steps this policy scores each lane's far blocks by the bound of the current query (as in
Quest, Tang et al., ICML 2024) and picks the best `recall_blocks`; the engine brings them
back into a reserved part of the budget, replacing the previous recalls (which stay in the
far tier), and the decode step attends to them beside the lane. In the spirit of InfiniGen
/ ArkVale / ShadowKV-style offloading; no single paper's parameters are copied.

Built by name, `budget` is the resident budget: the base policy keeps `budget -
recall_blocks * block` tokens and the recalled blocks use the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ctxlab.errors import CtxlabError
from ctxlab.policy.base import Policy, PolicyWrapper
from ctxlab.policy.budget import TOKENS_256, Budget
from ctxlab.policy.h2o import H2OPolicy
from ctxlab.policy.observation import FarObs
from ctxlab.policy.quest import page_bound
from ctxlab.policy.ranking import top_indices

TIERS = ("memory", "disk")


def _default_base() -> Policy:
    """H2O on the default 256 tokens less the default 8 recalled blocks of 8 tokens."""
    return H2OPolicy(budget=Budget(tokens=192))


@dataclass
class RecallPolicy(PolicyWrapper):
    """A base eviction policy plus `recall_blocks` far blocks per lane brought back."""

    name: ClassVar[str] = "recall"
    paper: ClassVar[str] = "far-tier recall with Quest-style block summaries"
    stack_layer: ClassVar[str] = "selection"
    base: Policy | None = field(default_factory=_default_base)
    recall_blocks: int = 8
    block: int = 8
    every: int = 1
    tier: str = "memory"
    path: str | None = None

    @classmethod
    def from_budget(cls, budget: Budget | None = None, **params: Any) -> Policy:
        """`base` by name gets the budget less the recalled share; a base object keeps its own."""
        base = params.pop("base", "h2o")
        probe = cls(base=None, **params)
        if not isinstance(base, str):
            if budget is not None:
                raise CtxlabError("give the budget to recall's base policy, not to both.")
            return cls(base=base, **params)
        budget = budget or TOKENS_256
        if budget.tokens is None:
            raise CtxlabError("recall takes its budget in tokens, not as a share of the prompt.")
        if budget.tokens <= probe.recall_tokens():
            raise CtxlabError(
                f"a budget of {budget} tokens is too small for recall: its "
                f"{probe.recall_blocks} recalled blocks alone take {probe.recall_tokens()} tokens."
            )
        from ctxlab.policy.registry import make_policy  # the registry imports this module

        rest = Budget(tokens=budget.tokens - probe.recall_tokens())
        return cls(base=make_policy(base, rest), **params)

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return super().needs | {"far"}

    def recall_tokens(self) -> int:
        return self.recall_blocks * self.block

    def check(self) -> None:
        super().check()
        if self.every < 1:
            raise CtxlabError(f"recall every must be >= 1 decode steps, got {self.every}.")
        if self.recall_blocks < 1 or self.block < 1:
            raise CtxlabError("recall needs at least one recalled block of at least one token.")
        if self.tier not in TIERS:
            raise CtxlabError(f"far tier kind {self.tier!r} is unknown; use 'memory' or 'disk'.")
        if self.base is None or not self.base.evicts:
            shown = "none" if self.base is None else self.base.name
            raise CtxlabError(f"recall needs a base policy that evicts (e.g. h2o), got {shown}.")

    def recall_due(self, step: int) -> bool:
        """Whether the far blocks are chosen again at this decode step."""
        return step % self.every == 0

    def choose_far(self, obs: FarObs) -> list[int]:
        """The far blocks (sorted indices) to bring back: the best `recall_blocks` by the
        Quest bound of the lane's query heads (the best head of the group counts)."""
        n = obs.kmin.shape[0]
        if n == 0:
            return []
        s = page_bound(obs.query, obs.kmin[None], obs.kmax[None]).amax(0)
        return sorted(top_indices(s, min(self.recall_blocks, n)).tolist())
