"""What every policy answers, and the scorer base every eviction paper shares.

A policy is a pure decision object: the engine shows it what it asked to see (a
`LayerView`, a `PageObs`, a `FarObs`; see `observation.py`) and executes the answer (kept
positions per lane, pages to read, far blocks to bring back). It never touches the pool,
the step plan or the engine, so the same object drives the paged engine and a transformers
cache (`ctxlab.hf`). `Policy` gives every hook a neutral answer (keep everything, no
budget), so the engine calls them without asking which policy it holds.

`ScorerPolicy` owns the part every eviction paper shares: a `Budget` (tokens or a share of
the prompt), tokens that are always kept (attention sinks, the observation / recent window)
and a per-lane top-k; a concrete policy only writes `score`.

Composition is by wrapping (`PolicyWrapper`): a storage format wraps any policy
(`QuantPolicy(base=...)`), recall wraps an eviction policy (`RecallPolicy(base=...)`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from ctxlab.errors import CtxlabError
from ctxlab.policy.budget import TOKENS_256, Budget
from ctxlab.policy.observation import LayerView
from ctxlab.policy.ranking import best_first

PositionMode = Literal["original", "cache-slot"]
StackLayer = Literal["retention", "selection", "storage"]
POSITION_MODES: tuple[str, ...] = ("original", "cache-slot")

Keep = list[torch.Tensor]  # per lane (KV head of one layer): sorted original positions kept
Hook = Callable[[LayerView], "Keep | None"]  # `Policy.on_prefill` or `Policy.on_decode`


@dataclass
class Policy:
    """Every hook with its neutral answer; the dataclass fields of a subclass are its
    parameters."""

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    stack_layer: ClassVar[StackLayer] = "retention"
    needs: ClassVar[frozenset[str]] = frozenset()  # see observation.NEEDS
    evicts: ClassVar[bool] = False  # answers with kept positions at the hooks
    position_mode: PositionMode = "original"

    @classmethod
    def from_budget(cls, budget: Budget | None = None, **params: Any) -> Policy:
        """The policy with `budget` put where this class keeps it (its `budget` field here).

        A class whose budget means something else (Longformer's window, recall's split)
        overrides this, so building a policy by name needs no name checks. A budget given
        to a policy that takes none is one sentence, not silently ignored.
        """
        if budget is not None:
            if "budget" not in {f.name for f in dataclasses.fields(cls)}:  # type: ignore[arg-type]
                raise CtxlabError(
                    f"{cls.name} takes no budget; drop the budget or choose a policy that "
                    "evicts or selects (e.g. snapkv)."
                )
            params["budget"] = budget
        return cls(**params)

    def check(self) -> None:
        """Raise CtxlabError (one sentence) for parameters that cannot work."""
        if self.position_mode not in POSITION_MODES:
            raise CtxlabError(
                f"position mode {self.position_mode!r} is unknown; use one of {POSITION_MODES}."
            )

    # -- storage --------------------------------------------------------------------------
    def storage(self) -> tuple[str | None, int]:
        """(KV storage format or None for the model dtype, quantization group)."""
        return None, 32

    # -- retention ------------------------------------------------------------------------
    def query_window(self) -> int:
        """How many recent queries per layer the engine must keep for this policy."""
        if self.needs & {"acc_attn", "obs_attn"}:
            return 32
        return 1 if self.needs & {"step_attn", "query"} else 0

    def resident_tokens(self, prompt_len: int) -> int | None:
        """Tokens a lane may hold in the pool for a prompt of this length (None: unbounded)."""
        return None

    def lane_budget(self, obs: LayerView) -> int | None:
        """Tokens each lane of this layer may keep (None: no budget, ask every layer)."""
        return None

    def decode_trigger(self, block_size: int = 1) -> int:
        """Tokens a lane may run over its budget during decode before it is cut back."""
        return 0

    def on_prefill(self, obs: LayerView) -> Keep | None:
        """Positions to keep per lane once the whole prompt is cached (None: keep all)."""
        return None

    def on_decode(self, obs: LayerView) -> Keep | None:
        """Positions to keep per lane after a decode step wrote its token (None: keep all)."""
        return None

    def wants_decode_hook(self, step: int) -> bool:
        """Whether `on_decode` has anything to do at this decode step (saves the engine work)."""
        return False

    # -- prefill attention ----------------------------------------------------------------
    def prefill_mask(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, prompt_len: int
    ) -> torch.Tensor | None:
        """`[n, L]` bool: which keys (original positions `k_pos`) each prefill query (at
        `q_pos`) of a `prompt_len`-token prompt may attend to, causality included; None:
        plain causal attention (every policy but a sparse-attention pattern applied in
        prefill)."""
        return None

    def prefill_key(self, prompt_len: int) -> str | None:
        """What this policy's prefill mask depends on for a `prompt_len`-token prompt, so
        the prefix cache shares blocks only between prompts computed under the same mask;
        None: no prefill mask."""
        return None


@dataclass
class ScorerPolicy(Policy):
    """Top-k by a per-slot score, with sinks and a recent window that are always kept.

    `slack` lets a lane grow up to `budget + slack` tokens during decode before it is cut
    back to the budget, so the engine compacts once per `slack + 1` steps instead of every
    step. The default (None) is one block less one token, so a lane is cut once per block
    and never holds more than its budget plus one partial block; 0 is the papers'
    one-token-per-step schedule.
    """

    evicts: ClassVar[bool] = True
    budget: Budget = TOKENS_256
    slack: int | None = None

    def __post_init__(self) -> None:
        self.budget = Budget.parse(self.budget)  # `H2OPolicy(budget=256)` works too

    def n_sinks(self) -> int:
        return 0

    def n_recent(self, lane_budget: int) -> int:
        return 0

    def resident_tokens(self, prompt_len: int) -> int | None:
        return self.lift(self.budget.tokens_for(prompt_len))

    def lane_budget(self, obs: LayerView) -> int:
        """Tokens each lane of this layer may keep (PyramidKV varies it with depth)."""
        return self.lift(self.budget.tokens_for(obs.prompt_len))

    def lift(self, lane_budget: int) -> int:
        """A ratio budget is lifted to what the policy always keeps (its sinks and window).

        A share of a short prompt can fall under that floor (0.5 of a 45-token chat is 22
        tokens, SnapKV's window alone is 32): such a prompt has nothing to evict and passes
        untouched, and a longer one keeps at least the floor, so a server with a ratio
        budget serves every prompt. A token budget is the user's exact number: it is checked
        as given (`check`), never lifted.
        """
        if self.budget.ratio is None:
            return lane_budget
        b = max(lane_budget, 1, self.n_sinks() + self.n_recent(lane_budget))
        for _ in range(64):  # the floor of every scorer is reached in a step or two
            try:
                self.check_budget(b)
            except CtxlabError:
                b += 1
                continue
            break
        return b

    def score(self, obs: LayerView) -> torch.Tensor:
        """`[n_kv, L]`: higher means keep; padding and forced slots are handled for you."""
        raise NotImplementedError

    def check(self) -> None:
        super().check()
        if self.slack is not None and self.slack < 0:
            raise CtxlabError(f"slack must be >= 0 tokens, got {self.slack}.")
        if self.budget.tokens is not None:
            self.check_budget(self.budget.tokens)

    def check_budget(self, lane_budget: int) -> None:
        forced = self.n_sinks() + self.n_recent(lane_budget)
        if lane_budget < forced or lane_budget < 1:
            raise CtxlabError(
                f"a budget of {lane_budget} tokens is too small for {self.name}: its sinks and "
                f"window alone keep {forced} tokens."
            )

    def select(self, obs: LayerView, trigger: int = 0) -> Keep | None:
        """Per-lane kept positions, or None when no lane is over `budget + trigger`."""
        b = self.lane_budget(obs)
        self.check_budget(b)
        lens = obs.lane_lens
        if int(lens.max()) <= b + trigger:
            return None
        pos = obs.positions
        valid = obs.valid
        forced = valid & (pos < self.n_sinks())
        forced |= valid & (pos >= obs.seq_len - self.n_recent(b))
        s = self.score(obs).float().clone()
        s = torch.where(forced, torch.full_like(s, float("inf")), s)
        s = s.masked_fill(~valid, float("-inf"))
        # One batched sort for every lane under the ranking rule (ties keep the earlier slot);
        # padding (-inf) sorts last, wherever it sits in the row.
        order = best_first(s)
        ks = lens.clamp(max=b).tolist()
        k = max(ks)
        kept = pos.gather(1, order[:, :k])
        if min(ks) == k:
            return list(torch.sort(kept, dim=1).values.unbind(0))
        return [torch.sort(kept[h, : ks[h]]).values for h in range(obs.n_kv)]

    def decode_trigger(self, block_size: int = 1) -> int:
        """The engine passes its block size; a pure call (block size 1) cuts at once."""
        return block_size - 1 if self.slack is None else self.slack

    def on_prefill(self, obs: LayerView) -> Keep | None:
        return self.select(obs)

    def on_decode(self, obs: LayerView) -> Keep | None:
        return self.select(obs, trigger=self.decode_trigger())

    def wants_decode_hook(self, step: int) -> bool:
        return True


class PromptEndCut:
    """Mixin for scorers that cut once the prompt is complete and, during decode, only when
    asked: whenever a lane has grown `rerun_every` tokens past its budget (SnapKV's optional
    re-run, KNorm). The dataclass using it declares `rerun_every: int | None = None`."""

    rerun_every: int | None

    def check(self) -> None:
        super().check()  # type: ignore[misc]
        if self.rerun_every is not None and self.rerun_every < 1:
            raise CtxlabError(f"rerun_every must be >= 1 decode tokens, got {self.rerun_every}.")

    def decode_trigger(self, block_size: int = 1) -> int:
        return (self.rerun_every or 1) - 1

    def on_decode(self, obs: LayerView) -> Keep | None:
        if self.rerun_every is None:
            return None
        return self.select(obs, trigger=self.decode_trigger())  # type: ignore[attr-defined]

    def wants_decode_hook(self, step: int) -> bool:
        return self.rerun_every is not None


@dataclass
class PolicyWrapper(Policy):
    """A policy around another: every hook is the base's (None: keep all).

    A subclass adds what it wraps the base with: a storage format, a far tier.
    """

    base: Policy | None = None

    def __getattr__(self, name: str) -> Any:
        """Anything the wrapper does not define is its base's (a wrapped Quest still picks
        pages): the wrapper is its base plus what it adds."""
        if name.startswith("__") or name == "base":
            raise AttributeError(name)
        base = self.__dict__.get("base")
        if base is None:
            raise AttributeError(f"{type(self).__name__} has no {name!r}")
        return getattr(base, name)

    def __post_init__(self) -> None:
        if self.base is not None and not isinstance(self.base, Policy):
            raise CtxlabError(f"{self.name} wraps a policy, got {type(self.base).__name__}.")
        if self.base is not None:
            self.position_mode = self.base.position_mode

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return self.base.needs if self.base is not None else frozenset()

    @property
    def evicts(self) -> bool:  # type: ignore[override]
        return self.base is not None and self.base.evicts

    def check(self) -> None:
        super().check()
        if self.base is not None:
            self.base.check()

    def storage(self) -> tuple[str | None, int]:
        return self.base.storage() if self.base is not None else (None, 32)

    def query_window(self) -> int:
        return self.base.query_window() if self.base is not None else 0

    def resident_tokens(self, prompt_len: int) -> int | None:
        return self.base.resident_tokens(prompt_len) if self.base is not None else None

    def lane_budget(self, obs: LayerView) -> int | None:
        return self.base.lane_budget(obs) if self.base is not None else None

    def decode_trigger(self, block_size: int = 1) -> int:
        return self.base.decode_trigger(block_size) if self.base is not None else 0

    def on_prefill(self, obs: LayerView) -> Keep | None:
        return self.base.on_prefill(obs) if self.base is not None else None

    def on_decode(self, obs: LayerView) -> Keep | None:
        return self.base.on_decode(obs) if self.base is not None else None

    def wants_decode_hook(self, step: int) -> bool:
        return self.base is not None and self.base.wants_decode_hook(step)

    def prefill_mask(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, prompt_len: int
    ) -> torch.Tensor | None:
        return self.base.prefill_mask(q_pos, k_pos, prompt_len) if self.base is not None else None

    def prefill_key(self, prompt_len: int) -> str | None:
        return self.base.prefill_key(prompt_len) if self.base is not None else None
