"""Runs a policy inside the engine: builds `LayerObs`, compacts lanes, frees blocks for real.

The engine calls four hooks (it never looks inside a policy):
- `wrap(backend)`: the attention backend is wrapped so the driver sees each layer's queries
  (kept for the last `obs_window` tokens of every sequence) and, for a selection policy,
  narrows what a decode step reads;
- `begin_step(items)` before a forward: which flat token rows belong to which sequence;
- `end_step(items)` after it: the prefill hook when a prompt is complete, the decode hook
  after each generated token, and, for purely positional policies, a cut after every
  prefill chunk (so a prompt far longer than the budget never sits whole in the pool);
- `position_offset(seq_id)`: how far cache-slot positions (StreamingLLM) run behind
  original ones; the runner subtracts it from each new token's position.

Compaction goes through `KVCacheManager.compact_lane`, which copies the kept tokens of a
lane into blocks that lane owns and returns the rest to the pool (a shared prefix block is
never written: the sequence only drops its reference). This module depends on `ctxlab.kv`
and duck-typed engine objects only, so the layering (policy below engine) holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ctxlab.kv.manager import KVCacheManager
from ctxlab.kv.seq_kv import SeqKV
from ctxlab.policy.base import (
    LayerObs,
    Policy,
    ScorerPolicy,
    attention_probs,
    budget_tokens,
    group_reduce,
    keep_to_slots,
)
from ctxlab.policy.recall import FarTier, RecallPolicy
from ctxlab.policy.recall_engine import RecallSelector
from ctxlab.policy.selection import QuestSelector


@dataclass
class StepItem:
    """One sequence's share of an engine step (built by the engine from its batch)."""

    seq_id: int
    kv: SeqKV
    start: int  # original position of the first new token (= tokens cached before)
    num_new: int
    prompt_len: int
    samples: bool  # the step reaches the sequence's last token (prefill end or decode)
    row: int = 0  # first row of this sequence in the flat batch (set by begin_step)


@dataclass
class SeqState:
    prompt_len: int
    prefilled: bool = False
    step: int = 0
    pos_shift: int = 0
    next_start: int = 0  # where the next step must start; anything else means a restart
    obs_q: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [H, w, d]
    obs_pos: torch.Tensor | None = None  # [w] original positions of those queries
    acc: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [n_kv, L]


class PolicyDriver:
    def __init__(self, policy: Policy, kv: KVCacheManager, n_heads: int, rope: Any = None):
        self.tier: FarTier | None = None
        self.selector: Any = None
        if isinstance(policy, RecallPolicy):
            # The base policy evicts into a far tier; the selector brings blocks back.
            from ctxlab.policy.registry import make_policy

            self.recall: RecallPolicy | None = policy
            self.tier = FarTier(policy.tier, policy.path)
            policy = make_policy(policy.base, policy.budget - policy.recall_tokens())
        else:
            self.recall = None
        self.policy = policy
        self.kv = kv
        self.layout = kv.layout
        self.n_heads = n_heads
        self.n_kv = self.layout.n_kv_heads
        self.rope = rope
        self.states: dict[int, SeqState] = {}
        self.items: list[StepItem] = []
        needs = policy.needs
        # Queries are recorded only as far back as something reads them.
        if needs & {"acc_attn", "obs_attn"}:
            self.obs_window = max(1, int(getattr(policy, "obs_window", 32) or 0))
        elif needs & {"step_attn", "query"}:
            self.obs_window = 1
        else:
            self.obs_window = 0
        self.positional = policy.evicts and not needs  # may cut after every prefill chunk
        if self.recall is not None and self.tier is not None:
            self.obs_window = max(self.obs_window, 1)
            self.selector = RecallSelector(self, self.recall, self.tier)
        elif policy.stack_layer == "selection":
            self.selector = QuestSelector(policy, kv)
        self.compactions = 0

    @property
    def unbounded_positions(self) -> bool:
        """Cache-slot positions with a bounded cache: no limit from the trained length."""
        return self.positional and self.policy.position_mode == "cache-slot" and bool(self.rope)

    def pool_need(self, need: int, prompt_len: int, chunk: int) -> int:
        """Tokens per lane one request can hold at once under this policy (admission check)."""
        if not self.positional:
            return need
        cap = budget_tokens(getattr(self.policy, "budget", need), prompt_len)
        return min(need, cap + int(getattr(self.policy, "slack", 0)) + chunk)

    # -- hooks ----------------------------------------------------------------------------
    def wrap(self, backend: Any) -> PolicyAttention:
        return PolicyAttention(backend, self)

    def position_offset(self, seq_id: int) -> int:
        st = self.states.get(seq_id)
        return st.pos_shift if st is not None else 0

    def begin_step(self, items: list[StepItem]) -> None:
        row = 0
        for it in items:
            it.row = row
            row += it.num_new
            st = self.states.get(it.seq_id)
            if st is None or it.start != st.next_start:  # new, or recomputed after preemption
                self.release(it.seq_id)
                st = self.states[it.seq_id] = SeqState(prompt_len=it.prompt_len)
            st.next_start = it.start + it.num_new
        self.items = items

    def release(self, seq_id: int) -> None:
        self.states.pop(seq_id, None)
        if isinstance(self.selector, RecallSelector):
            self.selector.release(seq_id)

    @torch.inference_mode()
    def end_step(self) -> None:
        pol = self.policy
        for it in self.items:
            st = self.states[it.seq_id]
            if not it.samples:
                if self.positional:
                    self._apply(it, st, pol.on_prefill)
                continue
            if not st.prefilled:
                st.prefilled = True
                if pol.evicts:
                    self._apply(it, st, pol.on_prefill, seed_acc=True)
            else:
                st.step += 1
                if "acc_attn" in pol.needs:
                    self._accumulate(it, st)
                if pol.evicts and pol.wants_decode_hook(st.step):
                    self._apply(it, st, pol.on_decode)
        self.items = []

    # -- queries seen by the backend ------------------------------------------------------
    def record_queries(self, layer: int, q: torch.Tensor) -> None:
        w = self.obs_window
        if not w:
            return
        for it in self.items:
            st = self.states[it.seq_id]
            new = q[it.row : it.row + it.num_new].transpose(0, 1).float()  # [H, n, d]
            old = st.obs_q.get(layer)
            st.obs_q[layer] = (new if old is None else torch.cat((old, new), 1))[:, -w:]
            if layer == 0:
                pos = torch.arange(it.start, it.start + it.num_new)
                old_pos = st.obs_pos
                st.obs_pos = (pos if old_pos is None else torch.cat((old_pos, pos)))[-w:]

    # -- observation ----------------------------------------------------------------------
    def _lanes(self, seq: SeqKV, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions [n_kv, L] with -1 padding, slots' keys [n_kv, L, d]) of one layer."""
        lanes = self.layout.lanes_of_layer(layer)
        lens = seq.lane_len[lanes]
        n = int(lens.max())
        if seq.slot_pos is None:
            pos = torch.arange(n).repeat(self.n_kv, 1)
        else:
            pos = seq.slot_pos[lanes, :n].clone()
        pos = pos.masked_fill(torch.arange(n)[None, :] >= lens[:, None], -1)
        nb = -(-n // self.layout.block_size)
        k, _ = self.kv.pool.gather(seq.table[lanes, :nb])
        return pos, k[:, :n]

    def _obs(self, it: StepItem, st: SeqState, layer: int) -> tuple[LayerObs, torch.Tensor]:
        needs = self.policy.needs
        pos, keys = self._lanes(it.kv, layer)
        obs = LayerObs(
            layer=layer,
            n_layers=self.layout.n_layers,
            n_heads=self.n_heads,
            positions=pos,
            seq_len=it.start + it.num_new,
            prompt_len=st.prompt_len,
            step=st.step,
            keys=keys if "keys" in needs else None,
        )
        q = st.obs_q.get(layer)
        if "obs_attn" in needs and q is not None:
            obs.obs_attn = attention_probs(q, keys, pos, st.obs_pos)
        if st.step > 0 and q is not None:
            if "query" in needs:
                obs.query = q[:, -1]
            if "step_attn" in needs:
                obs.step_attn = attention_probs(q[:, -1:], keys, pos, st.obs_pos[-1:])[:, 0]
        if "acc_attn" in needs:
            obs.acc_attn = self._acc(st, layer, pos.shape[1])
        return obs, keys

    def _acc(self, st: SeqState, layer: int, n: int) -> torch.Tensor:
        acc = st.acc.get(layer)
        if acc is None:
            acc = torch.zeros(self.n_kv, 0)
        if acc.shape[1] < n:
            acc = torch.nn.functional.pad(acc, (0, n - acc.shape[1]))
        st.acc[layer] = acc
        return acc

    def _accumulate(self, it: StepItem, st: SeqState) -> None:
        """H2O's running sum: this step's attention, summed over each KV head's group.

        All layers at once: one gather of every lane, one batched softmax.
        """
        seq, lay = it.kv, self.layout
        n_layers, n_kv, d = lay.n_layers, self.n_kv, lay.head_dim
        n = int(seq.lane_len.max())
        k, _ = self.kv.pool.gather(seq.table[:, : -(-n // lay.block_size)])
        k = k[:, :n].float().view(n_layers, n_kv, n, d)
        valid = (torch.arange(n)[None, :] < seq.lane_len[:, None]).view(n_layers, n_kv, 1, n)
        q = torch.stack([st.obs_q[layer][:, -1] for layer in range(n_layers)])
        q = q.view(n_layers, n_kv, self.n_heads // n_kv, d)
        logits = torch.einsum("lkgd,lknd->lkgn", q, k) / d**0.5
        probs = torch.softmax(logits.masked_fill(~valid, float("-inf")), -1).sum(2)
        for layer in range(n_layers):
            acc = self._acc(st, layer, int(seq.lane_len[lay.lanes_of_layer(layer)].max()))
            acc += probs[layer, :, : acc.shape[1]]

    # -- compaction -----------------------------------------------------------------------
    def _over_budget(self, it: StepItem, st: SeqState, layer: int, trigger: int) -> bool:
        """Cheap check (no keys, no attention) whether a scorer policy would cut this layer."""
        pol = self.policy
        if not isinstance(pol, ScorerPolicy):
            return True
        lens = it.kv.lane_len[self.layout.lanes_of_layer(layer)]
        light = LayerObs(
            layer, self.layout.n_layers, self.n_heads, torch.empty(self.n_kv, 0), 0, st.prompt_len
        )
        return int(lens.max()) > pol.lane_budget(light) + trigger

    def _apply(self, it: StepItem, st: SeqState, hook: Any, seed_acc: bool = False) -> None:
        pol = self.policy
        trigger = pol.decode_trigger() if st.step > 0 and isinstance(pol, ScorerPolicy) else 0
        for layer in range(self.layout.n_layers):
            if not seed_acc and not self._over_budget(it, st, layer, trigger):
                continue
            obs, keys = self._obs(it, st, layer)
            if seed_acc and obs.acc_attn is not None and layer in st.obs_q:
                # H2O's scores start from the prompt's last `obs_window` queries.
                p = attention_probs(st.obs_q[layer], keys, obs.positions, st.obs_pos)
                obs.acc_attn += group_reduce(p.sum(1), self.n_kv, "sum")
            keep = hook(obs)
            if keep is None:
                continue
            self._compact_layer(it, st, layer, obs.positions, keep)

    def _compact_layer(
        self,
        it: StepItem,
        st: SeqState,
        layer: int,
        positions: torch.Tensor,
        keep: list[torch.Tensor],
    ) -> None:
        lanes = self.layout.lanes_of_layer(layer)
        acc = st.acc.get(layer)
        new_acc = []
        cache_slot = self.policy.position_mode == "cache-slot" and self.rope is not None
        for h, kept in enumerate(keep):
            lane = lanes.start + h
            slots = keep_to_slots(positions[h], kept)
            if acc is not None:
                new_acc.append(acc[h, slots])
            if len(slots) == int(it.kv.lane_len[lane]):
                continue
            if self.tier is not None:
                self._to_far(it, lane, positions[h], slots)
            self.kv.compact_lane(it.kv, lane, slots)
            self.compactions += 1
            if cache_slot:
                self._reposition(it.kv, lane, slots)
        if acc is not None:
            n = max(len(a) for a in new_acc)
            st.acc[layer] = torch.stack(
                [torch.nn.functional.pad(a, (0, n - len(a))) for a in new_acc]
            )
        if cache_slot and layer == self.layout.n_layers - 1:
            st.pos_shift = it.start + it.num_new - int(it.kv.lane_len.max())

    def _to_far(self, it: StepItem, lane: int, positions: torch.Tensor, kept: torch.Tensor) -> None:
        """Send the slots of a lane that are about to be dropped to the far tier, by block."""
        n = int(it.kv.lane_len[lane])
        gone = torch.ones(n, dtype=torch.bool)
        gone[kept] = False
        slots = torch.nonzero(gone).flatten()
        bs = self.layout.block_size
        rows = it.kv.table[lane, slots // bs] * bs + slots % bs
        pool = self.kv.pool
        k = pool._k_rows[rows, : self.layout.head_dim]
        v = pool._v_rows[rows, : self.layout.head_dim_v]
        size = self.recall.block if self.recall is not None else bs
        for a in range(0, len(slots), size):
            sl = slice(a, a + size)
            self.tier.put((it.seq_id, lane), positions[slots[sl]], k[sl], v[sl])  # type: ignore[union-attr]

    def _reposition(self, seq: SeqKV, lane: int, slots: torch.Tensor) -> None:
        """Cache-slot positions: the key now in slot j was rotated for slot s; move it by j-s.

        Invariant: in cache-slot mode every lane's slot j holds a key rotated for position j
        (lanes keep the same count, so one position offset serves the whole sequence).
        """
        bs = self.layout.block_size
        n = len(slots)
        delta = torch.arange(n) - slots
        if not bool((delta != 0).any()):
            return
        rows = seq.table[lane, : -(-n // bs)].repeat_interleave(bs)[:n] * bs + torch.arange(n) % bs
        pool = self.kv.pool
        d = self.layout.head_dim
        k = pool._k_rows[rows, :d]
        pool._k_rows[rows, :d] = self.rope.shift_keys(k[:, None, :], delta)[:, 0]


class PolicyAttention:
    """The engine's attention backend with the driver looking over its shoulder."""

    def __init__(self, inner: Any, driver: PolicyDriver):
        self.inner = inner
        self.driver = driver

    @property
    def plan(self) -> Any:
        return self.inner.plan

    @plan.setter
    def plan(self, value: Any) -> None:
        self.inner.plan = value

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        self.driver.record_queries(layer_idx, q)
        sel = self.driver.selector
        if sel is None:
            return self.inner.attend(layer_idx, q, k, v)
        return sel.attend(self.inner, layer_idx, q, k, v)


def build_driver(
    policy: Any, budget: Any, kv: KVCacheManager, n_heads: int, rope: Any = None
) -> tuple[Policy | None, PolicyDriver | None]:
    """(policy, driver) for the engine; `full` and no policy need no driver at all."""
    from ctxlab.errors import CtxlabError
    from ctxlab.policy.full import FullPolicy
    from ctxlab.policy.registry import make_policy

    if policy is None:
        if budget is not None:
            raise CtxlabError("a budget needs a policy; pass policy= (e.g. 'snapkv') as well.")
        return None, None
    if isinstance(policy, str):
        extra = {"page": kv.block_size} if policy == "quest" else {}
        policy = make_policy(policy, budget, **extra)
    elif not isinstance(policy, Policy):
        raise CtxlabError(f"policy must be a name or a Policy, got {type(policy).__name__}.")
    elif budget is not None:
        raise CtxlabError("give the budget inside the Policy object or by name, not both.")
    if isinstance(policy, FullPolicy):
        return policy, None
    if policy.name == "quant":
        raise CtxlabError(
            f"the {policy.name} policy is not wired into the engine yet; its pure code lives "
            f"in ctxlab.policy.{policy.name}."
        )
    if policy.name == "quest":  # Quest's pages are the pool's blocks
        policy.page = kv.block_size  # type: ignore[attr-defined]
    policy.check()
    return policy, PolicyDriver(policy, kv, n_heads, rope)
