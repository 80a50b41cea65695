"""Quest inside the engine: per-block key summaries kept beside the pool, sparse decode reads.

The summaries (per-channel key min and max of every physical block) are updated as the
backend writes keys, so choosing pages never reads the keys themselves. For each decode
step and layer the selector picks the pages of every sequence and lane in one batched
top-k (the bound is two matmuls), and the decode rows attend to those pages only; writes
and prefill go through the backend untouched. It counts the blocks a step would read
without selection and the blocks it does read.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ctxlab.kv.manager import KVCacheManager
from ctxlab.policy.base import Policy
from ctxlab.policy.scoring import WithoutDecode


class QuestSelector:
    def __init__(self, policy: Policy, kv: KVCacheManager):
        lay = kv.layout
        self.policy = policy
        self.kv = kv
        self.bs = lay.block_size
        self.items: Any = None  # the step's StepItems (set by the driver): prompt lengths
        self.sink_pages = int(getattr(policy, "sink_pages", 1))
        n = kv.pool.num_blocks
        self.kmin = torch.full((n, lay.head_dim), float("inf"))
        self.kmax = torch.full((n, lay.head_dim), float("-inf"))
        self.blocks_total = 0  # blocks a dense decode would have read
        self.blocks_read = 0
        self._rest = WithoutDecode()
        self._pages: tuple[Any, torch.Tensor] | None = None  # (items, pages per decode row)

    def rebuild(self) -> None:
        """Summaries of every block from the keys already in the pool.

        For a selector put on a pool that was filled without it (a benchmark forking one
        prefilled engine per policy); blocks nobody wrote summarise zeros, harmlessly.
        """
        pool = self.kv.pool
        keys, _ = pool.gather(torch.arange(pool.num_blocks)[:, None])  # [n, bs, d]
        self.kmin = keys.float().amin(1)
        self.kmax = keys.float().amax(1)

    @property
    def read_fraction(self) -> float:
        return self.blocks_read / self.blocks_total if self.blocks_total else 1.0

    def _pages_per_row(self, n_rows: int) -> torch.Tensor:
        """Pages per decode row: one count for a token budget; per sequence for a ratio of
        its prompt (decode rows are the step's one-token items, in batch order)."""
        if self._pages is not None and self._pages[0] is self.items:
            return self._pages[1]  # once per step, not per layer
        pages = self._count_pages(n_rows)
        self._pages = (self.items, pages)
        return pages

    def _count_pages(self, n_rows: int) -> torch.Tensor:
        pol: Any = self.policy  # its `page` is the pool's block size (build_driver sets it)
        if not pol.budget.is_ratio:
            return torch.full((n_rows,), pol.pages_per_step(), dtype=torch.int64)
        lens = [it.prompt_len for it in self.items if it.num_new == 1]
        assert len(lens) == n_rows, "decode rows are the one-token items of the step"
        return torch.tensor([pol.pages_per_step(n) for n in lens], dtype=torch.int64)

    def _update(self, rows: torch.Tensor, k: torch.Tensor) -> None:
        """Fold newly written keys (`rows [T, Hkv]`, `k [T, Hkv, d]`) into block summaries."""
        rows = rows.reshape(-1)
        kf = k.reshape(rows.numel(), -1).float()
        blocks = rows // self.bs
        fresh = blocks[rows % self.bs == 0]  # a block's first slot: the block is new
        if fresh.numel():
            self.kmin.index_fill_(0, fresh, float("inf"))
            self.kmax.index_fill_(0, fresh, float("-inf"))
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
        n_have = int(have.sum())
        self.blocks_total += n_have
        per_row = self._pages_per_row(B)  # [B] pages each sequence's lanes may read
        if nb <= int(per_row.min()):
            self.blocks_read += n_have
            return inner.attend(layer, q, k, v)
        P = min(int(per_row.max()), nb)
        # Every sequence at once. The bound sum_c max(q_c min_c, q_c max_c) is
        # q+ . max + q- . min (q+ and q- the positive and negative parts of q): two matmuls.
        qd = q.index_select(0, plan.decode_idx).float()
        qg = qd.view(B, n_kv, -1, qd.shape[-1])  # [B, n_kv, g, d]
        flat = table.reshape(-1)  # index_select: a row copy, far cheaper than kmin[table]
        kmin = self.kmin.index_select(0, flat).view(B, n_kv, nb, -1)  # [B, n_kv, nb, d]
        kmax = self.kmax.index_select(0, flat).view(B, n_kv, nb, -1)
        bound = torch.matmul(qg.clamp(min=0), kmax.transpose(-1, -2))
        bound = bound + torch.matmul(qg.clamp(max=0), kmin.transpose(-1, -2))
        bound = bound.amax(2)  # [B, n_kv, nb]: the best head of each GQA group
        page_idx = torch.arange(nb)
        real = page_idx < have[..., None]
        forced = (page_idx < self.sink_pages) | (page_idx == have[..., None] - 1)
        bound = bound.masked_fill(~real, float("-inf")).masked_fill(forced & real, float("inf"))
        top = torch.topk(bound, P, dim=-1).indices  # [B, n_kv, P], best first
        in_budget = (torch.arange(P) < per_row.view(B, 1, 1)).expand_as(top)
        top, order = torch.sort(top, dim=-1)
        ok = torch.gather(real, -1, top) & torch.gather(in_budget, -1, order)
        self.blocks_read += int(ok.sum())
        sel_tab = torch.gather(table, -1, top)
        slot = top[..., None] * self.bs + torch.arange(self.bs)  # [B, n_kv, P, bs]
        mask = ((slot < lens[..., None, None]) & ok[..., None]).reshape(B, n_kv, 1, -1)
        # Writes (and any prefill rows) through the backend; the decode rows read only the
        # chosen pages.
        out = self._rest(inner, layer, q, k, v)
        kk, vv = inner.pool.gather(sel_tab)  # [B, n_kv, P * bs, d]
        o = F.scaled_dot_product_attention(qg.to(kk.dtype), kk, vv, attn_mask=mask)
        out.index_copy_(0, plan.decode_idx, o.reshape(B, -1, o.shape[-1]).to(out.dtype))
        return out
