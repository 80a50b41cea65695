"""Recall's engine side: evicted blocks go to the far tier; chosen ones come back as rows.

A recall policy wraps an eviction policy. When a cut drops tokens of a lane, `evict` sends
them to the `FarTier` a block of `policy.block` tokens at a time (before the pool frees
them). At each decode step and layer, `rows` gives every decode row's lanes their recalled
blocks as extra K/V rows for `decode_attention`: the policy picks the far blocks by their
summaries (`choose_far`, re-chosen every `every` steps), and a per-lane scratch keeps what
came back (a block already there is not moved again). Resident bytes therefore stay within
the budget: the pool holds the base policy's share and the scratch at most the recall share.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ctxlab.engine.far_tier import FarTier
from ctxlab.kv.layout import KVLayout
from ctxlab.kv.manager import KVCacheManager
from ctxlab.kv.seq_kv import SeqKV
from ctxlab.policy.observation import FarObs


class Recalls(Protocol):
    """What the engine asks of a recall policy."""

    block: int
    tier: str
    path: str | None

    def recall_tokens(self) -> int: ...

    def recall_due(self, step: int) -> bool: ...

    def choose_far(self, obs: FarObs) -> list[int]: ...


Lane = tuple[int, int]  # (sequence id, lane)


class FarReads:
    def __init__(self, policy: Recalls, layout: KVLayout):
        self.policy = policy
        self.tier = FarTier(policy.tier, policy.path)
        self.layout = layout
        self.n_kv = layout.n_kv_heads
        self.slots = policy.recall_tokens()
        self.scratch: dict[Lane, dict[int, tuple[torch.Tensor, ...]]] = {}
        self.step_rows: list[tuple[int, int]] = []  # (seq id, decode step) per decode row

    def scratch_bytes(self) -> int:
        return sum(
            int(k.numel() * k.element_size() + v.numel() * v.element_size())
            for blocks in self.scratch.values()
            for _, k, v in blocks.values()
        )

    def release(self, seq_id: int) -> None:
        for key in [k for k in self.scratch if k[0] == seq_id]:
            del self.scratch[key]
        for key in [k for k in self.tier.lanes if isinstance(k, tuple) and k[0] == seq_id]:
            self.tier.drop(key)

    def evict(
        self,
        kv: KVCacheManager,
        seq: SeqKV,
        seq_id: int,
        lane: int,
        positions: torch.Tensor,
        kept: torch.Tensor,
    ) -> None:
        """Send the slots of a lane that are about to be dropped to the far tier, by block."""
        n = int(seq.lane_len[lane])
        gone = torch.ones(n, dtype=torch.bool)
        gone[kept] = False
        slots = torch.nonzero(gone).flatten()
        bs = self.layout.block_size
        rows = seq.table[lane, slots // bs] * bs + slots % bs
        k, v = kv.pool.read_rows(rows)  # dequantized when the pool is quantized
        self.put(seq_id, lane, positions[slots], k, v)

    def put(
        self, seq_id: int, lane: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Evicted tokens of one lane (`positions [n]`, `k [n, d]`, `v [n, dv]`) into the far
        tier, `policy.block` tokens a block."""
        size = self.policy.block
        for a in range(0, len(positions), size):
            sl = slice(a, a + size)
            self.tier.put((seq_id, lane), positions[sl], k[sl], v[sl])

    def _lane_rows(self, seq_id: int, step: int, lane: int, q: torch.Tensor) -> list[tuple]:
        key = (seq_id, lane)
        have = self.scratch.get(key, {})
        if self.policy.recall_due(step) or key not in self.scratch:
            kmin, kmax = self.tier.summaries(key)  # host tensors: the tier lives in host memory
            best = self.policy.choose_far(FarObs(q.detach().cpu(), kmin, kmax))
            new = [i for i in best if i not in have]
            have = {i: have[i] if i in have else self.tier.read(key, i) for i in best}
            if new:
                self.tier.recalls += 1
            self.scratch[key] = have
        return list(have.values())

    def rows(self, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Far K, V `[B, n_kv, slots, d]` and mask `[B, n_kv, slots]` for the decode rows
        (`q [B, H, d]`, in decode-batch order) of one layer."""
        lay = self.layout
        B = q.shape[0]
        g = q.shape[1] // self.n_kv
        fk = torch.zeros(B, self.n_kv, self.slots, lay.head_dim, dtype=lay.read_dtype)
        fv = torch.zeros(B, self.n_kv, self.slots, lay.head_dim_v, dtype=lay.read_dtype)
        fm = torch.zeros(B, self.n_kv, self.slots, dtype=torch.bool)
        first = lay.lanes_of_layer(layer).start
        for b, (seq_id, step) in enumerate(self.step_rows):
            for h in range(self.n_kv):
                at = 0
                for _, k, v in self._lane_rows(seq_id, step, first + h, q[b, h * g : (h + 1) * g]):
                    n = k.shape[0]
                    fk[b, h, at : at + n] = k.to(lay.read_dtype)
                    fv[b, h, at : at + n] = v.to(lay.read_dtype)
                    fm[b, h, at : at + n] = True
                    at += n
        dev = q.device
        return fk.to(dev), fv.to(dev), fm.to(dev)
