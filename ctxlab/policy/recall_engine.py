"""`recall` inside the engine: decode steps also attend to the best far-tier blocks.

The base eviction policy runs with `budget - recall_blocks * block` tokens per lane, and
every block it evicts goes to the `FarTier` (host memory or a disk file) with its key
summary (see `PolicyDriver._compact_layer`). For each decode token and lane this selector
scores the lane's far blocks by the Quest bound of the current query (its GQA group's
heads), keeps the best `recall_blocks` of them in a per-lane scratch area (re-chosen every
`every` steps; a block already there is not moved again), and attends to the resident lane
plus the scratch in one softmax. Resident bytes therefore stay within the budget: the pool
holds the base policy's share and the scratch at most the recall share.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ctxlab.policy.recall import FarTier, RecallPolicy
from ctxlab.policy.scoring import WithoutDecode


class RecallSelector:
    def __init__(self, driver: Any, policy: RecallPolicy, tier: FarTier):
        self.driver = driver
        self._rest = WithoutDecode()
        self.policy = policy
        self.tier = tier
        lay = driver.layout
        self.layout = lay
        self.n_kv = lay.n_kv_heads
        self.slots = policy.recall_blocks * policy.block
        # (seq_id, lane) -> {far block index: (positions, k, v)} brought back and kept
        self.scratch: dict[tuple[int, int], dict[int, tuple[torch.Tensor, ...]]] = {}

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

    def _far(self, seq_id: int, step: int, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Far K, V `[n_kv, slots, d]` and mask `[n_kv, slots]` for one sequence and layer."""
        lay, pol = self.layout, self.policy
        g = q.shape[0] // self.n_kv
        fk = torch.zeros(self.n_kv, self.slots, lay.head_dim, dtype=lay.dtype)
        fv = torch.zeros(self.n_kv, self.slots, lay.head_dim_v, dtype=lay.dtype)
        fm = torch.zeros(self.n_kv, self.slots, dtype=torch.bool)
        for h in range(self.n_kv):
            key = (seq_id, lay.lanes_of_layer(layer).start + h)
            have = self.scratch.get(key, {})
            if step % pol.every == 0 or key not in self.scratch:
                best = self.tier.best(key, q[h * g : (h + 1) * g], pol.recall_blocks)
                new = [i for i in best if i not in have]
                have = {i: have[i] if i in have else self.tier.read(key, i) for i in best}
                if new:
                    self.tier.recalls += 1
                self.scratch[key] = have
            at = 0
            for _, k, v in have.values():
                n = k.shape[0]
                fk[h, at : at + n] = k.to(lay.dtype)
                fv[h, at : at + n] = v.to(lay.dtype)
                fm[h, at : at + n] = True
                at += n
        return fk, fv, fm

    def attend(
        self, inner: Any, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        plan = inner.plan
        if plan.decode_idx is None:
            return inner.attend(layer, q, k, v)
        out = self._rest(inner, layer, q, k, v)  # writes and prefill only
        lanes = self.layout.lanes_of_layer(layer)
        kk, vv = inner.pool.gather(plan.decode_table[:, lanes])  # [B, n_kv, L, d]
        mask = plan.decode_mask[:, lanes, 0]  # [B, n_kv, L]
        qd = q[plan.decode_idx]  # [B, H, d]
        dec = [it for it in self.driver.items if it.num_new == 1]
        far = [
            self._far(it.seq_id, self.driver.states[it.seq_id].step, layer, qd[b])
            for b, it in enumerate(dec)
        ]
        kk = torch.cat((kk, torch.stack([f[0] for f in far])), 2)
        vv = torch.cat((vv, torch.stack([f[1] for f in far])), 2)
        mask = torch.cat((mask, torch.stack([f[2] for f in far])), 2).unsqueeze(2)
        B = qd.shape[0]
        qg = qd.view(B, self.n_kv, -1, qd.shape[-1])
        o = F.scaled_dot_product_attention(qg, kk, vv, attn_mask=mask)
        out[plan.decode_idx] = o.reshape(B, -1, o.shape[-1])
        return out
