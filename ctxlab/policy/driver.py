"""Runs a policy inside the engine: builds `LayerObs`, compacts lanes, frees blocks for real.

The engine calls four hooks (it never looks inside a policy):
- `wrap(backend)`: the attention backend is wrapped (`scoring.PolicyAttention`) so the
  driver sees each layer's queries (kept for the last `obs_window` tokens of every
  sequence), gets H2O's decode attention from the attention itself, and, for a selection
  policy, narrows what a decode step reads;
- `begin_step(items)` before a forward: which flat token rows belong to which sequence;
- `end_step()` after it: the prefill hook when a prompt is complete, the decode hook
  after each generated token, and, for purely positional policies, a cut after every
  prefill chunk (so a prompt far longer than the budget never sits whole in the pool);
- `position_offset(seq_id)`: how far cache-slot positions (StreamingLLM) run behind
  original ones; the runner subtracts it from each new token's position.

Cost: the per-step work is a handful of batched tensor ops per sequence. During decode a
lane is cut only once it is `decode_trigger` tokens over its budget (by default one block
less one token: one cut per block of tokens, and a lane never holds more than its budget
plus one partial block), which layers are over is one comparison per sequence, and a cut
compacts every lane of a sequence in one batched pass (`compact.compact_lanes`). Keys are
gathered only for policies that score with them. This module depends on `ctxlab.kv` and
duck-typed engine objects only, so the layering (policy below engine) holds.
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
    group_reduce,
)
from ctxlab.policy.compact import compact_lanes, keep_to_slots_batched, move_rows
from ctxlab.policy.recall import FarTier, RecallPolicy
from ctxlab.policy.recall_engine import RecallSelector
from ctxlab.policy.scoring import PolicyAttention, QueryLog
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
    log: QueryLog | None = None  # the last `obs_window` queries of every layer
    acc: torch.Tensor | None = None  # [n_lanes, capacity] accumulated attention per slot
    budgets: torch.Tensor | None = field(default=None, repr=False)  # [n_lanes] tokens


class PolicyDriver:
    def __init__(self, policy: Policy, kv: KVCacheManager, n_heads: int, rope: Any = None):
        self.tier: FarTier | None = None
        self.selector: Any = None
        if isinstance(policy, RecallPolicy):
            # The base policy evicts into a far tier; the selector brings blocks back.
            from ctxlab.policy.registry import make_policy

            self.recall: RecallPolicy | None = policy
            self.tier = FarTier(policy.tier, policy.path)
            policy = make_policy(policy.base, policy.base_budget())
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
        elif needs & {"step_attn", "query"} and policy.stack_layer != "selection":
            self.obs_window = 1
        else:
            self.obs_window = 0
        self.positional = policy.evicts and not needs  # may cut after every prefill chunk
        if self.recall is not None and self.tier is not None:
            self.obs_window = max(self.obs_window, 1)
            self.selector = RecallSelector(self, self.recall, self.tier)
        elif policy.stack_layer == "selection":
            self.selector = QuestSelector(policy, kv)
        # H2O: decode attention computed by the wrapper doubles as the score (no second read).
        self.scores_in_attention = "acc_attn" in needs and self.selector is None
        self.step_probs: list[torch.Tensor | None] = [None] * self.layout.n_layers
        self.uneven_layers = False  # set once a sequence gets per-layer budgets (PyramidKV)
        self.trigger = (
            policy.decode_trigger(self.layout.block_size) if isinstance(policy, ScorerPolicy) else 0
        )
        self._q: list[torch.Tensor | None] = [None] * self.layout.n_layers
        self._q_rows: torch.Tensor | None = None
        self.compactions = 0

    @property
    def unbounded_positions(self) -> bool:
        """Cache-slot positions with a bounded cache: no limit from the trained length."""
        return self.positional and self.policy.position_mode == "cache-slot" and bool(self.rope)

    def pool_need(self, need: int, prompt_len: int, chunk: int) -> int:
        """Tokens per lane one request can hold at once under this policy (admission check)."""
        if not self.positional:
            return need
        budget = getattr(self.policy, "budget", None)
        cap = need if budget is None else budget.tokens_for(prompt_len)
        return min(need, cap + self.trigger + chunk)

    # -- hooks ----------------------------------------------------------------------------
    def wrap(self, backend: Any) -> PolicyAttention:
        return PolicyAttention(backend, self)

    def position_offset(self, seq_id: int) -> int:
        st = self.states.get(seq_id)
        return st.pos_shift if st is not None else 0

    def begin_step(self, items: list[StepItem]) -> None:
        row = 0
        keep_rows = []
        for it in items:
            it.row = row
            if self.obs_window:  # only the rows a query log will hold
                keep_rows.append(
                    torch.arange(max(row, row + it.num_new - self.obs_window), row + it.num_new)
                )
            row += it.num_new
            st = self.states.get(it.seq_id)
            if st is None or it.start != st.next_start:  # new, or recomputed after preemption
                self.release(it.seq_id)
                st = self.states[it.seq_id] = SeqState(prompt_len=it.prompt_len)
            st.next_start = it.start + it.num_new
        self._q_rows = torch.cat(keep_rows) if keep_rows else None
        self.items = items
        if self.selector is not None:
            self.selector.items = items

    def release(self, seq_id: int) -> None:
        self.states.pop(seq_id, None)
        if isinstance(self.selector, RecallSelector):
            self.selector.release(seq_id)

    def record_queries(self, layer: int, q: torch.Tensor) -> None:
        """Called by the backend per layer: keep (a view of) the rows the query logs need."""
        if self._q_rows is not None:
            self._q[layer] = q.index_select(0, self._q_rows)

    @torch.inference_mode()
    def end_step(self) -> None:
        pol = self.policy
        if self.obs_window and self._q_rows is not None:
            self._store_queries()
        if self.scores_in_attention and self.step_probs[0] is not None:
            self._accumulate_step()
        for it in self.items:
            st = self.states[it.seq_id]
            if not it.samples:
                if self.positional:
                    self._cut(it, st, pol.on_prefill, 0)
                continue
            if not st.prefilled:
                st.prefilled = True
                if pol.evicts:
                    self._cut(it, st, pol.on_prefill, 0, seed=True)
            else:
                st.step += 1
                if "acc_attn" in pol.needs and not self.scores_in_attention:
                    self._accumulate(it, st)
                if pol.evicts and pol.wants_decode_hook(st.step):
                    self._cut(it, st, pol.on_decode, self.trigger)
        self.items = []

    # -- queries and scores seen by the backend -------------------------------------------
    def _store_queries(self) -> None:
        lay = self.layout
        qs = torch.stack(self._q).float()  # [n_layers, R, H, d]: the kept rows, item by item
        at = 0
        for it in self.items:
            st = self.states[it.seq_id]
            m = min(it.num_new, self.obs_window)
            if st.log is None:
                st.log = QueryLog(lay.n_layers, self.n_heads, self.obs_window, qs.shape[-1])
            st.log.append(qs[:, at : at + m], it.start + it.num_new - m)
            at += m
        self._q = [None] * lay.n_layers

    def _accumulate_step(self) -> None:
        """Add this step's decode attention (from the wrapper) to each sequence's H2O score."""
        probs = torch.stack(self.step_probs)  # [n_layers, B, n_kv, L]
        n_layers, B, n_kv, L = probs.shape
        probs = probs.transpose(0, 1).reshape(B, n_layers * n_kv, L)
        dec = [it for it in self.items if it.num_new == 1]  # the decode batch, in order
        for b, it in enumerate(dec):
            st = self.states[it.seq_id]
            if st.prefilled:  # a 1-token last prefill chunk is counted by the prefill seed
                self._acc_rows(st, L)[:, :L] += probs[b]
        self.step_probs = [None] * n_layers

    def _accumulate(self, it: StepItem, st: SeqState) -> None:
        """H2O's running sum when a selector owns the decode attention (recall over h2o)."""
        seq, lay = it.kv, self.layout
        n_layers, n_kv, d = lay.n_layers, self.n_kv, lay.head_dim
        n = int(seq.lane_len.max())
        k, _ = self.kv.pool.gather(seq.table[:, : -(-n // lay.block_size)])
        k = k[:, :n].float().view(n_layers, n_kv, n, d)
        valid = (torch.arange(n)[None, :] < seq.lane_len[:, None]).view(n_layers, n_kv, 1, n)
        assert st.log is not None
        q = st.log.ordered()[0][:, :, -1].view(n_layers, n_kv, self.n_heads // n_kv, d)
        logits = torch.einsum("lkgd,lknd->lkgn", q, k) / d**0.5
        probs = torch.softmax(logits.masked_fill(~valid, float("-inf")), -1).sum(2)
        self._acc_rows(st, n)[:, :n] += probs.view(n_layers * n_kv, n)

    def _acc_rows(self, st: SeqState, n: int) -> torch.Tensor:
        """The sequence's score rows `[n_lanes, capacity >= n]`, grown with zeros."""
        acc = st.acc
        if acc is None or acc.shape[1] < n:
            cap = -(-(n + 64) // 64) * 64
            grown = torch.zeros(self.layout.n_lanes, cap)
            if acc is not None:
                grown[:, : acc.shape[1]] = acc
            st.acc = acc = grown
        return acc

    # -- observation ----------------------------------------------------------------------
    def _positions(self, seq: SeqKV, layer: int) -> torch.Tensor:
        """Original positions `[n_kv, L]` of one layer's lanes, -1 padding."""
        lanes = self.layout.lanes_of_layer(layer)
        lens = seq.lane_len[lanes]
        n = int(lens.max())
        if seq.slot_pos is None:
            pos = torch.arange(n).repeat(self.n_kv, 1)
        else:
            pos = seq.slot_pos[lanes, :n].clone()
        return pos.masked_fill(torch.arange(n)[None, :] >= lens[:, None], -1)

    def _keys(self, seq: SeqKV, layer: int, n: int) -> torch.Tensor:
        lanes = self.layout.lanes_of_layer(layer)
        k, _ = self.kv.pool.gather(seq.table[lanes, : -(-n // self.layout.block_size)])
        return k[:, :n]

    def _lanes(self, seq: SeqKV, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions [n_kv, L] with -1 padding, slots' keys [n_kv, L, d]) of one layer."""
        pos = self._positions(seq, layer)
        return pos, self._keys(seq, layer, pos.shape[1])

    def _obs(
        self, it: StepItem, st: SeqState, layer: int, q: torch.Tensor | None, q_pos: Any, seed: bool
    ) -> tuple[LayerObs, torch.Tensor | None]:
        needs = self.policy.needs
        pos = self._positions(it.kv, layer)
        n = pos.shape[1]
        want = "keys" in needs or (q is not None and bool(needs & {"obs_attn", "step_attn"}))
        keys = self._keys(it.kv, layer, n) if want or (seed and q is not None) else None
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
        if q is not None and keys is not None:
            if "obs_attn" in needs:
                obs.obs_attn = attention_probs(q, keys, pos, q_pos)
            if st.step > 0 and "step_attn" in needs:
                obs.step_attn = attention_probs(q[:, -1:], keys, pos, q_pos[-1:])[:, 0]
        if st.step > 0 and q is not None and "query" in needs:
            obs.query = q[:, -1]
        if "acc_attn" in needs:
            lanes = self.layout.lanes_of_layer(layer)
            obs.acc_attn = self._acc_rows(st, n)[lanes, :n]  # a view: seeding adds in place
        return obs, keys

    # -- cutting --------------------------------------------------------------------------
    def _lane_budgets(self, st: SeqState) -> torch.Tensor:
        """Tokens each lane may keep (per layer for PyramidKV), computed once per sequence."""
        if st.budgets is None:
            pol, lay = self.policy, self.layout
            per_layer = []
            for layer in range(lay.n_layers):
                light = LayerObs(
                    layer, lay.n_layers, self.n_heads, torch.empty(self.n_kv, 0), 0, st.prompt_len
                )
                per_layer.append(pol.lane_budget(light))  # type: ignore[attr-defined]
            st.budgets = torch.tensor(per_layer, dtype=torch.int64).repeat_interleave(self.n_kv)
            # Layers of different budgets: let each layer's decode read only its own width.
            self.uneven_layers = self.uneven_layers or len(set(per_layer)) > 1
        return st.budgets

    def _layers_over(self, it: StepItem, st: SeqState, trigger: int) -> list[int]:
        """Layers with a lane over `budget + trigger`: one comparison for every lane."""
        if not isinstance(self.policy, ScorerPolicy):
            return list(range(self.layout.n_layers))
        over = it.kv.lane_len > self._lane_budgets(st) + trigger
        return torch.nonzero(over.view(self.layout.n_layers, self.n_kv).any(1)).flatten().tolist()

    def _cut(self, it: StepItem, st: SeqState, hook: Any, trigger: int, seed: bool = False) -> None:
        """Ask the policy about every layer over budget, then compact all cut lanes at once."""
        lay = self.layout
        seed = seed and "acc_attn" in self.policy.needs  # H2O seeds every layer's scores
        layers = list(range(lay.n_layers)) if seed else self._layers_over(it, st, trigger)
        if not layers:
            return
        q_all, q_pos = st.log.ordered() if st.log is not None else (None, None)
        lanes: list[int] = []
        keep: list[torch.Tensor] = []
        for layer in layers:
            q = q_all[layer] if q_all is not None else None
            obs, keys = self._obs(it, st, layer, q, q_pos, seed)
            if seed and obs.acc_attn is not None and q is not None and keys is not None:
                # H2O's scores start from the prompt's last `obs_window` queries.
                p = attention_probs(q, keys, obs.positions, q_pos)
                obs.acc_attn += group_reduce(p.sum(1), self.n_kv, "sum")
            kept = hook(obs)
            if kept is None:
                continue
            first = lay.lanes_of_layer(layer).start
            lens = it.kv.lane_len[first : first + self.n_kv].tolist()
            for h, slots in enumerate(keep_to_slots_batched(obs.positions, kept)):
                if len(slots) == lens[h]:
                    continue
                if self.tier is not None:
                    self._to_far(it, first + h, obs.positions[h], slots)
                lanes.append(first + h)
                keep.append(slots)
        if not lanes:
            return
        if st.acc is not None:  # scores move with their tokens
            move_rows(st.acc, lanes, keep)
        cache_slot = self.policy.position_mode == "cache-slot" and self.rope is not None
        compact_lanes(self.kv, it.kv, lanes, keep, self.rope if cache_slot else None)
        self.compactions += len(lanes)
        if cache_slot:
            st.pos_shift = it.start + it.num_new - int(it.kv.lane_len.max())

    def _to_far(self, it: StepItem, lane: int, positions: torch.Tensor, kept: torch.Tensor) -> None:
        """Send the slots of a lane that are about to be dropped to the far tier, by block."""
        n = int(it.kv.lane_len[lane])
        gone = torch.ones(n, dtype=torch.bool)
        gone[kept] = False
        slots = torch.nonzero(gone).flatten()
        bs = self.layout.block_size
        rows = it.kv.table[lane, slots // bs] * bs + slots % bs
        k, v = self.kv.pool.read_rows(rows)  # dequantized when the pool is quantized
        size = self.recall.block if self.recall is not None else bs
        for a in range(0, len(slots), size):
            sl = slice(a, a + size)
            self.tier.put((it.seq_id, lane), positions[slots[sl]], k[sl], v[sl])  # type: ignore[union-attr]
