"""Quest inside the engine: per-block key summaries kept beside the pool, sparse decode reads.

The summaries (per-channel key min and max of every physical block) are updated as the
backend writes keys, so choosing pages never reads the keys themselves. For each decode
token the selector narrows, for the current layer only, the block table and length mask
the paged attention reads to the chosen pages; prefill is untouched. It counts the blocks a
step would read without selection and the blocks it does read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ctxlab.kv.manager import KVCacheManager
from ctxlab.policy.base import Policy, group_reduce
from ctxlab.policy.quest import page_bound


class QuestSelector:
    def __init__(self, policy: Policy, kv: KVCacheManager):
        lay = kv.layout
        self.policy = policy
        self.kv = kv
        self.bs = lay.block_size
        self.n_pages = max(1, int(getattr(policy, "token_budget", 512)) // self.bs)
        self.sink_pages = int(getattr(policy, "sink_pages", 1))
        n = kv.pool.num_blocks
        self.kmin = torch.full((n, lay.head_dim), float("inf"))
        self.kmax = torch.full((n, lay.head_dim), float("-inf"))
        self.blocks_total = 0  # blocks a dense decode would have read
        self.blocks_read = 0

    @property
    def read_fraction(self) -> float:
        return self.blocks_read / self.blocks_total if self.blocks_total else 1.0

    def _update(self, rows: torch.Tensor, k: torch.Tensor) -> None:
        """Fold newly written keys (`rows [T, Hkv]`, `k [T, Hkv, d]`) into block summaries."""
        rows = rows.reshape(-1)
        kf = k.reshape(rows.numel(), -1).float()
        blocks = rows // self.bs
        fresh = blocks[rows % self.bs == 0]  # a block's first slot: the block is new
        self.kmin[fresh] = float("inf")
        self.kmax[fresh] = float("-inf")
        idx = blocks[:, None].expand_as(kf)
        self.kmin.scatter_reduce_(0, idx, kf, "amin")
        self.kmax.scatter_reduce_(0, idx, kf, "amax")

    def attend(
        self, inner: Any, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        plan = inner.plan
        self._update(plan.rows[layer], k)
        if plan.decode_idx is None:
            return inner.attend(layer, q, k, v)
        lanes = self.kv.layout.lanes_of_layer(layer)
        table = plan.decode_table[:, lanes]  # [B, n_kv, nb]
        lens = plan.decode_mask[:, lanes, 0].sum(-1)  # [B, n_kv]
        B, n_kv, nb = table.shape
        have = (lens + self.bs - 1) // self.bs  # [B, n_kv] pages per lane
        self.blocks_total += int(have.sum())
        P = min(self.n_pages, nb)
        if nb <= P:
            self.blocks_read += int(have.sum())
            return inner.attend(layer, q, k, v)
        qd = q[plan.decode_idx].float()  # [B, H, d]
        sel_tab = torch.zeros(B, n_kv, P, dtype=table.dtype)
        sel_len = torch.zeros(B, n_kv, P * self.bs, dtype=torch.bool)
        for b in range(B):
            bound = group_reduce(
                page_bound(qd[b], self.kmin[table[b]], self.kmax[table[b]]), n_kv, "max"
            )  # [n_kv, nb]
            page_idx = torch.arange(nb)
            real = page_idx[None, :] < have[b][:, None]
            bound = bound.masked_fill(~real, float("-inf"))
            forced = (page_idx[None, :] < self.sink_pages) | (
                page_idx[None, :] == have[b][:, None] - 1
            )
            bound = bound.masked_fill(forced & real, float("inf"))
            top = torch.sort(torch.topk(bound, P, dim=1).indices, dim=1).values  # [n_kv, P]
            ok = torch.gather(real, 1, top)
            sel_tab[b] = torch.gather(table[b], 1, top)
            slot = top[..., None] * self.bs + torch.arange(self.bs)  # [n_kv, P, bs]
            sel_len[b] = ((slot < lens[b][:, None, None]) & ok[..., None]).reshape(n_kv, -1)
            self.blocks_read += int(ok.sum())
        n_lanes = plan.decode_table.shape[1]
        full_tab = torch.zeros(B, n_lanes, P, dtype=table.dtype)
        full_tab[:, lanes] = sel_tab
        full_mask = torch.zeros(B, n_lanes, 1, P * self.bs, dtype=torch.bool)
        full_mask[:, lanes, 0] = sel_len
        inner.plan = dataclasses.replace(plan, decode_table=full_tab, decode_mask=full_mask)
        try:
            return inner.attend(layer, q, k, v)
        finally:
            inner.plan = plan
