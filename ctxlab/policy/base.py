"""The narrow seam between the engine and a retention or selection policy.

A policy never touches the pool. At two hooks the engine shows it one layer of one sequence
as a `LayerObs` (the original positions each lane holds, and only what the policy asked for:
the observation window's attention at the end of prefill, the current query's attention or
the accumulated attention during decode, the keys, the query) and the policy answers, per
lane (KV head of that layer), the sorted original positions to keep. The engine does the
compaction and the freeing, so what a policy says is dropped is really gone from the pool.

`ScorerPolicy` owns the part every eviction paper shares: a `Budget` (tokens or a share of
the prompt, parsed once),
tokens that are always kept (attention sinks, the observation / recent window) and a per-lane
top-k; a concrete policy only writes `score`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from ctxlab.errors import CtxlabError
from ctxlab.policy.budget import TOKENS_256, Budget

PositionMode = Literal["original", "cache-slot"]
StackLayer = Literal["retention", "selection", "storage"]
POSITION_MODES: tuple[str, ...] = ("original", "cache-slot")

# What a hook can carry; a policy lists the ones it reads so the engine computes no more.
NEEDS = ("obs_attn", "step_attn", "acc_attn", "keys", "query")


@dataclass
class LayerObs:
    """One layer of one sequence as a policy sees it at a hook.

    `positions[h, i]` is the original position of slot i of KV head h (-1 pads shorter
    lanes; real slots are sorted ascending). Optional tensors are present only if the
    policy's `needs` names them.
    """

    layer: int
    n_layers: int
    n_heads: int  # query heads of the layer (GQA groups are consecutive query heads)
    positions: torch.Tensor  # [n_kv, L] int64
    seq_len: int  # tokens seen so far; the next token gets this position
    prompt_len: int
    step: int = 0  # decode steps done (0 at the prefill hook)
    keys: torch.Tensor | None = None  # [n_kv, L, d] (as stored: rotated)
    query: torch.Tensor | None = None  # [n_heads, d] current decode query
    obs_attn: torch.Tensor | None = None  # [n_heads, w, L] last w prompt queries, softmaxed
    step_attn: torch.Tensor | None = None  # [n_heads, L] current query, softmaxed
    acc_attn: torch.Tensor | None = None  # [n_kv, L] attention summed over steps and group

    @property
    def n_kv(self) -> int:
        return int(self.positions.shape[0])

    @property
    def valid(self) -> torch.Tensor:
        return self.positions >= 0

    @property
    def lane_lens(self) -> torch.Tensor:
        return self.valid.sum(dim=1)

    def need(self, name: str) -> torch.Tensor:
        t = getattr(self, name)
        if t is None:
            raise RuntimeError(f"the engine did not provide {name!r} to this policy")
        return t


def group_reduce(x: torch.Tensor, n_kv: int, how: str = "mean") -> torch.Tensor:
    """Fold query heads `[n_heads, ...]` into their KV heads `[n_kv, ...]` (GQA groups)."""
    g = x.shape[0] // n_kv
    y = x.reshape(n_kv, g, *x.shape[1:])
    if how == "mean":
        return y.mean(dim=1)
    if how == "sum":
        return y.sum(dim=1)
    if how == "max":
        return y.amax(dim=1)
    raise ValueError(f"unknown reduction {how!r}")


def attention_probs(
    q: torch.Tensor, keys: torch.Tensor, key_pos: torch.Tensor, q_pos: torch.Tensor
) -> torch.Tensor:
    """Softmax attention of queries `q [H, t, d]` over lanes `keys [n_kv, L, d]`.

    Causal by original position (a query at p sees keys at positions <= p), padding
    (`key_pos < 0`) masked; returns `[H, t, L]` in float32. This is the slow, obvious
    computation the hooks are defined by; the engine may pass probabilities it already has.
    """
    n_heads, _, d = q.shape
    n_kv = keys.shape[0]
    k = keys.float().repeat_interleave(n_heads // n_kv, dim=0)
    kp = key_pos.repeat_interleave(n_heads // n_kv, dim=0)
    logits = torch.einsum("htd,hld->htl", q.float(), k) / math.sqrt(d)
    ok = (kp[:, None, :] >= 0) & (kp[:, None, :] <= q_pos.view(1, -1, 1))
    logits = logits.masked_fill(~ok, float("-inf"))
    return torch.softmax(logits, dim=-1).nan_to_num(0.0)


@dataclass
class Policy:
    """What every policy answers; the dataclass fields of a subclass are its parameters."""

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    stack_layer: ClassVar[StackLayer] = "retention"
    needs: ClassVar[frozenset[str]] = frozenset()
    position_mode: PositionMode = "original"

    @classmethod
    def from_budget(cls, budget: Budget | None = None, **params: Any) -> Policy:
        """The policy with `budget` put where this class keeps it (its `budget` field here).

        A class whose budget means something else (Longformer's window) overrides this, so
        building a policy by name needs no name checks. A budget given to a policy that
        takes none is one sentence, not silently ignored.
        """
        if budget is not None:
            if "budget" not in {f.name for f in dataclasses.fields(cls)}:  # type: ignore[arg-type]
                raise CtxlabError(
                    f"{cls.name} takes no budget; drop the budget or choose a policy that "
                    "evicts or selects (e.g. snapkv)."
                )
            params["budget"] = budget
        return cls(**params)

    @property
    def evicts(self) -> bool:
        return self.stack_layer == "retention"

    def check(self) -> None:
        """Raise CtxlabError (one sentence) for parameters that cannot work."""
        if self.position_mode not in POSITION_MODES:
            raise CtxlabError(
                f"position mode {self.position_mode!r} is unknown; use one of {POSITION_MODES}."
            )

    def on_prefill(self, obs: LayerObs) -> list[torch.Tensor] | None:
        """Positions to keep per lane once the whole prompt is cached (None: keep all)."""
        return None

    def on_decode(self, obs: LayerObs) -> list[torch.Tensor] | None:
        """Positions to keep per lane after a decode step wrote its token (None: keep all)."""
        return None

    def wants_decode_hook(self, step: int) -> bool:
        """Whether `on_decode` has anything to do at this decode step (saves the engine work)."""
        return False


@dataclass
class ScorerPolicy(Policy):
    """Top-k by a per-slot score, with sinks and a recent window that are always kept.

    `slack` lets a lane grow up to `budget + slack` tokens during decode before it is cut
    back to the budget, so the engine compacts once per `slack + 1` steps instead of every
    step. The default (None) is one block less one token, so a lane is cut once per block
    and never holds more than its budget plus one partial block; 0 is the papers'
    one-token-per-step schedule.
    """

    budget: Budget = TOKENS_256
    slack: int | None = None

    def __post_init__(self) -> None:
        self.budget = Budget.parse(self.budget)  # `H2OPolicy(budget=256)` works too

    def n_sinks(self) -> int:
        return 0

    def n_recent(self, lane_budget: int) -> int:
        return 0

    def lane_budget(self, obs: LayerObs) -> int:
        """Tokens each lane of this layer may keep (PyramidKV varies it with depth)."""
        return self.budget.tokens_for(obs.prompt_len)

    def score(self, obs: LayerObs) -> torch.Tensor:
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

    def select(self, obs: LayerObs, trigger: int = 0) -> list[torch.Tensor] | None:
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
        # One batched stable sort for every lane: equal scores keep the earlier slot first
        # (deterministic); padding (-inf) sorts last, wherever it sits in the row.
        order = torch.argsort(s, dim=1, descending=True, stable=True)
        ks = lens.clamp(max=b).tolist()
        k = max(ks)
        kept = pos.gather(1, order[:, :k])
        if min(ks) == k:
            return list(torch.sort(kept, dim=1).values.unbind(0))
        return [torch.sort(kept[h, : ks[h]]).values for h in range(obs.n_kv)]

    def decode_trigger(self, block_size: int = 1) -> int:
        """Tokens a lane may run over its budget during decode before it is cut back.

        The engine passes its block size; a pure call (block size 1) cuts at once.
        """
        return block_size - 1 if self.slack is None else self.slack

    def on_prefill(self, obs: LayerObs) -> list[torch.Tensor] | None:
        return self.select(obs)

    def on_decode(self, obs: LayerObs) -> list[torch.Tensor] | None:
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

    def on_decode(self, obs: LayerObs) -> list[torch.Tensor] | None:
        if self.rerun_every is None:
            return None
        return self.select(obs, trigger=self.decode_trigger())  # type: ignore[attr-defined]

    def wants_decode_hook(self, step: int) -> bool:
        return self.rerun_every is not None


def keep_to_slots(positions: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Slot indices (in one lane whose real slots hold sorted `positions`) of kept positions."""
    n = int((positions >= 0).sum())
    slots = torch.searchsorted(positions[:n], keep)
    if slots.numel() and (int(slots.max()) >= n or not torch.equal(positions[slots], keep)):
        raise RuntimeError("a policy kept a position its lane does not hold")
    return slots
