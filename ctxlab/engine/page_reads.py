"""A page-selection policy's engine side (Quest, MoBA, DSA, NSA): summaries beside the pool,
narrowed reads.

The summaries the policy names in its `needs` (`page_bounds`: per-channel key min and max of
every physical block; `page_means`: the sums of its keys and values and its token count;
`index_keys`: every slot's indexer key, `policy.index_keys` of the key written) are updated
after each step from what attention wrote (`record`, from the step's readback), so choosing
never reads the keys themselves; a decode row's newest page, the only one written during
its step, is always read, so its summary is never needed before the step ends. For each
decode step and layer, `narrow` shows the policy every decode row's query and the summaries
of the blocks its lanes hold (a `PageObs`), and turns its `PageChoice` into what
`decode_attention` reads: the block table and mask of the pages read in full, plus extra
rows (tokens read one by one from the pool, and mean-pooled rows of compressed pages, each
with its logit bias); writes and prefill are untouched. It counts the blocks and the keys a
step would read without selection and the ones it does read (a compressed row is one key).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from ctxlab.engine.step_plan import ExtraRows
from ctxlab.kv.manager import KVCacheManager
from ctxlab.policy.observation import PageChoice, PageObs


class SelectsPages(Protocol):
    """What the engine asks of a page-selection policy."""

    needs: frozenset[str]

    def check_page(self, page: int) -> None: ...

    def pages_per_step(self, prompt_len: int, page: int) -> int: ...

    def choose_pages(self, obs: PageObs) -> PageChoice: ...


class PageReads:
    def __init__(self, policy: SelectsPages, kv: KVCacheManager):
        lay = kv.layout
        policy.check_page(lay.block_size)
        self.policy = policy
        self.kv = kv
        self.bs = lay.block_size
        needs = policy.needs
        self.bounds = "page_bounds" in needs
        self.means = "page_means" in needs
        self.index = "index_keys" in needs
        n = kv.pool.num_blocks
        dev = kv.pool.device
        self.kmin = torch.full((n, lay.head_dim), float("inf"), device=dev)
        self.kmax = torch.full((n, lay.head_dim), float("-inf"), device=dev)
        if not self.bounds:
            self.kmin = self.kmax = torch.zeros(0, lay.head_dim, device=dev)
        self.ksum = torch.zeros((n if self.means else 0, lay.head_dim), device=dev)
        self.vsum = torch.zeros((n if self.means else 0, lay.head_dim_v), device=dev)
        self.count = torch.zeros(n if self.means else 0, device=dev)
        self.ikeys: torch.Tensor | None = None  # [n * bs, r], sized at the first record
        self.blocks_total = 0  # blocks a dense decode would have read
        self.blocks_read = 0
        self.keys_total = 0  # keys (tokens) a dense decode would have read
        self.keys_read = 0  # keys attended: full pages' tokens, single tokens, mean rows
        self.per_row = torch.zeros(0, dtype=torch.int64)  # pages each decode row may read
        if kv.alloc.num_used or kv.alloc.num_cached_groups:
            # a reader built over a pool that already holds keys (the runtime rebuilt after
            # a failed step, whose requests then hit the prefix cache): summarise them, or
            # the cached blocks would look empty to the policy
            self.rebuild()

    def rebuild(self) -> None:
        """Summaries of every block from the keys already in the pool.

        For a reader put on a pool that was filled without it (a benchmark forking one
        prefilled engine per policy); blocks nobody wrote summarise zeros, harmlessly (a
        page mean counts every slot of the block).
        """
        pool = self.kv.pool
        keys, values = pool.gather(torch.arange(pool.num_blocks, device=pool.device)[:, None])
        if self.bounds:
            self.kmin = keys.float().amin(1)
            self.kmax = keys.float().amax(1)
        if self.means:
            self.ksum = keys.float().sum(1)
            self.vsum = values.float().sum(1)
            self.count = torch.full_like(self.count, float(self.bs))
        if self.index:
            self.ikeys = self.policy.index_keys(keys.reshape(-1, keys.shape[-1]))  # type: ignore[attr-defined]

    @property
    def read_fraction(self) -> float:
        return self.blocks_read / self.blocks_total if self.blocks_total else 1.0

    @property
    def keys_read_fraction(self) -> float:
        return self.keys_read / self.keys_total if self.keys_total else 1.0

    def begin_step(self, decode_prompt_lens: list[int]) -> None:
        """Pages per decode row, once per step (a ratio budget is a share of each prompt)."""
        self.per_row = torch.tensor(
            [self.policy.pages_per_step(n, self.bs) for n in decode_prompt_lens], dtype=torch.int64
        )

    def record(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
        """Fold newly written keys and values (`rows [T, Hkv]`, `k [T, Hkv, d]`) into the
        summaries."""
        rows = rows.reshape(-1)
        kf = k.reshape(rows.numel(), -1).float()
        blocks = rows // self.bs
        fresh = blocks[rows % self.bs == 0]  # a block's first slot: the block is new
        if self.bounds:
            if fresh.numel():
                self.kmin.index_fill_(0, fresh, float("inf"))
                self.kmax.index_fill_(0, fresh, float("-inf"))
            idx = blocks[:, None].expand_as(kf)
            self.kmin.scatter_reduce_(0, idx, kf, "amin")
            self.kmax.scatter_reduce_(0, idx, kf, "amax")
        if self.means:
            assert v is not None, "page means need the values written"
            if fresh.numel():
                self.ksum.index_fill_(0, fresh, 0.0)
                self.vsum.index_fill_(0, fresh, 0.0)
                self.count.index_fill_(0, fresh, 0.0)
            self.ksum.index_add_(0, blocks, kf)
            self.vsum.index_add_(0, blocks, v.reshape(rows.numel(), -1).float())
            self.count.index_add_(0, blocks, torch.ones_like(blocks, dtype=self.count.dtype))
        if self.index:
            ik = self.policy.index_keys(kf)  # type: ignore[attr-defined]
            if self.ikeys is None:
                n = self.kv.pool.num_blocks * self.bs
                self.ikeys = torch.zeros(n, ik.shape[-1], device=ik.device)
            self.ikeys.index_copy_(0, rows, ik)

    def narrow(
        self, layer: int, q: torch.Tensor, table: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, ExtraRows | None] | None:
        """(table `[B, n_kv, P]`, mask `[B, n_kv, 1, P * bs]`, extra rows or None) of the
        chosen reads for one layer (`q [B, n_kv, g, d]`, `table [B, n_kv, nb]`, `mask
        [B, n_kv, 1, L]`); None when every row may read every page it holds."""
        lens = mask[:, :, 0].sum(-1)  # [B, n_kv]
        B, n_kv, nb = table.shape
        have = (lens + self.bs - 1) // self.bs  # [B, n_kv] pages per lane
        n_have = int(have.sum())
        n_keys = int(lens.sum())
        self.blocks_total += n_have
        self.keys_total += n_keys
        per_row = self.per_row
        if nb <= int(per_row.min()):
            self.blocks_read += n_have
            self.keys_read += n_keys
            return None
        flat = table.reshape(-1)  # index_select: a row copy, far cheaper than kmin[table]
        obs = PageObs(q.float(), None, None, have, per_row, page=self.bs)
        if self.bounds:
            obs.kmin = self.kmin.index_select(0, flat).view(B, n_kv, nb, -1)  # [B, n_kv, nb, d]
            obs.kmax = self.kmax.index_select(0, flat).view(B, n_kv, nb, -1)
        cnt = None
        if self.means:
            cnt = self.count.index_select(0, flat).view(B, n_kv, nb)
            ksum = self.ksum.index_select(0, flat).view(B, n_kv, nb, -1)
            obs.kmean = ksum / cnt.clamp(min=1)[..., None]
        if self.index:
            assert self.ikeys is not None
            slots = (flat[:, None] * self.bs + torch.arange(self.bs, device=flat.device)).view(-1)
            obs.ikeys = self.ikeys.index_select(0, slots).view(B, n_kv, nb * self.bs, -1)
            obs.lens = lens
        choice = self.policy.choose_pages(obs)
        top, ok = choice.pages, choice.ok
        self.blocks_read += int(ok.sum())
        sel_tab = torch.gather(table, -1, top)
        slot = top[..., None] * self.bs + torch.arange(self.bs, device=top.device)
        sel_mask = ((slot < lens[..., None, None]) & ok[..., None]).reshape(B, n_kv, 1, -1)
        self.keys_read += int(sel_mask.sum())
        parts: list[ExtraRows] = []
        if choice.tokens is not None:  # single tokens, read from their pool rows
            assert choice.tokens_ok is not None
            tok = choice.tokens
            rows = torch.gather(table, -1, tok // self.bs) * self.bs + tok % self.bs
            kt, vt = self.kv.pool.read_rows(rows)
            parts.append((kt, vt, bias(choice.tokens_ok, torch.zeros_like(kt[..., 0]))))
            self.keys_read += int(choice.tokens_ok.sum())
        if choice.compressed is not None:  # one mean row per compressed page
            assert cnt is not None and obs.kmean is not None
            vmean = self.vsum.index_select(0, flat).view(B, n_kv, nb, -1)
            vmean = vmean / cnt.clamp(min=1)[..., None]
            use = choice.compressed & (cnt > 0)
            parts.append((obs.kmean, vmean, bias(use, cnt.clamp(min=1).log())))
            self.keys_read += int(use.sum())
        if not parts:
            return sel_tab, sel_mask, None
        if len(parts) == 1:
            return sel_tab, sel_mask, parts[0]
        ek, ev, eb = zip(*parts, strict=True)
        return sel_tab, sel_mask, (torch.cat(ek, 2), torch.cat(ev, 2), torch.cat(eb, 2))


def bias(use: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Additive logit bias of extra rows: `value` where `use`, -inf elsewhere (float32)."""
    return value.float().masked_fill(~use, -math.inf)
