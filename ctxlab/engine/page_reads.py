"""A page-selection policy's engine side (Quest): block summaries beside the pool, narrowed reads.

The summaries (per-channel key min and max of every physical block) are updated after each
step from the keys attention wrote (`record`, from the step's readback), so choosing pages
never reads the keys themselves; a decode row's newest page, the only one written during
its step, is always read, so its summary is never needed before the step ends. For each
decode step and layer, `narrow` shows the policy every decode row's query and the summaries
of the blocks its lanes hold (a `PageObs`), and turns the pages it picks into the block
table and mask `decode_attention` reads; writes and prefill are untouched. It counts the
blocks a step would read without selection and the blocks it does read.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ctxlab.kv.manager import KVCacheManager
from ctxlab.policy.observation import PageObs


class SelectsPages(Protocol):
    """What the engine asks of a page-selection policy."""

    def check_page(self, page: int) -> None: ...

    def pages_per_step(self, prompt_len: int, page: int) -> int: ...

    def choose_pages(self, obs: PageObs) -> tuple[torch.Tensor, torch.Tensor]: ...


class PageReads:
    def __init__(self, policy: SelectsPages, kv: KVCacheManager):
        lay = kv.layout
        policy.check_page(lay.block_size)
        self.policy = policy
        self.kv = kv
        self.bs = lay.block_size
        n = kv.pool.num_blocks
        dev = kv.pool.device
        self.kmin = torch.full((n, lay.head_dim), float("inf"), device=dev)
        self.kmax = torch.full((n, lay.head_dim), float("-inf"), device=dev)
        self.blocks_total = 0  # blocks a dense decode would have read
        self.blocks_read = 0
        self.per_row = torch.zeros(0, dtype=torch.int64)  # pages each decode row may read

    def rebuild(self) -> None:
        """Summaries of every block from the keys already in the pool.

        For a reader put on a pool that was filled without it (a benchmark forking one
        prefilled engine per policy); blocks nobody wrote summarise zeros, harmlessly.
        """
        pool = self.kv.pool
        keys, _ = pool.gather(torch.arange(pool.num_blocks, device=pool.device)[:, None])
        self.kmin = keys.float().amin(1)
        self.kmax = keys.float().amax(1)

    @property
    def read_fraction(self) -> float:
        return self.blocks_read / self.blocks_total if self.blocks_total else 1.0

    def begin_step(self, decode_prompt_lens: list[int]) -> None:
        """Pages per decode row, once per step (a ratio budget is a share of each prompt)."""
        self.per_row = torch.tensor(
            [self.policy.pages_per_step(n, self.bs) for n in decode_prompt_lens], dtype=torch.int64
        )

    def record(self, rows: torch.Tensor, k: torch.Tensor) -> None:
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

    def narrow(
        self, layer: int, q: torch.Tensor, table: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(table `[B, n_kv, P]`, mask `[B, n_kv, 1, P * bs]`) of the chosen pages for one
        layer (`q [B, n_kv, g, d]`, `table [B, n_kv, nb]`, `mask [B, n_kv, 1, L]`); None
        when every row may read every page it holds."""
        lens = mask[:, :, 0].sum(-1)  # [B, n_kv]
        B, n_kv, nb = table.shape
        have = (lens + self.bs - 1) // self.bs  # [B, n_kv] pages per lane
        n_have = int(have.sum())
        self.blocks_total += n_have
        per_row = self.per_row
        if nb <= int(per_row.min()):
            self.blocks_read += n_have
            return None
        flat = table.reshape(-1)  # index_select: a row copy, far cheaper than kmin[table]
        kmin = self.kmin.index_select(0, flat).view(B, n_kv, nb, -1)  # [B, n_kv, nb, d]
        kmax = self.kmax.index_select(0, flat).view(B, n_kv, nb, -1)
        top, ok = self.policy.choose_pages(PageObs(q.float(), kmin, kmax, have, per_row))
        self.blocks_read += int(ok.sum())
        sel_tab = torch.gather(table, -1, top)
        slot = top[..., None] * self.bs + torch.arange(self.bs, device=top.device)
        sel_mask = ((slot < lens[..., None, None]) & ok[..., None]).reshape(B, n_kv, 1, -1)
        return sel_tab, sel_mask
