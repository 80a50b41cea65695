"""`nsa`: compressed + selected + window reads (selection, not eviction: everything stays cached).

Yuan et al., "Native Sparse Attention: Hardware-Aligned and Natively Trainable Sparse
Attention" (DeepSeek, ACL 2025, arXiv:2502.11089). Parameters copied: three branches over
the same cache: COMPRESSED (each block of keys and values summarised by one row), SELECTED
(the top blocks by the compressed attention's probabilities, summed over the query heads of
a GQA group, so the group reads one set of blocks) and a sliding WINDOW (the recent tokens).

What differs, because NSA's parts are trained and ours are not:
- compression is the mean of the block's keys and of its values (NSA learns an MLP with
  intra-block positions);
- the three branches share ONE softmax instead of three outputs mixed by learned gates: the
  step attends to the selected and window pages in full plus one compressed row per OTHER
  page (a page read in full is not also read compressed), the compressed row's logit raised
  by log(tokens in the page) so it stands for that many keys;
- blocks are the engine's pages (compression and selection blocks are the same size).

Keys read per step per lane = the pages read in full x page + one row per other page; the
selected count is what keeps that within `budget`: with n pages held, w forced pages (sinks,
window and current) and page size P, s = floor((budget - n) / (P - 1)) - w selected pages
(never fewer than 0: a context of more than `budget` pages reads its compressed rows and
forced pages only, over the budget, and says so in the measured keys read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.errors import CtxlabError
from ctxlab.policy.observation import PageChoice, PageObs
from ctxlab.policy.page_select import PageSelector


def compressed_probs(query: torch.Tensor, kmean: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """NSA's selection score: softmax of q . k_cmp / sqrt(d) over the real pages, summed over
    each GQA group: `[B, n_kv, g, d]`, `[B, n_kv, nb, d]`, `[B, n_kv, nb]` -> `[B, n_kv, nb]`."""
    d = query.shape[-1]
    logits = torch.matmul(query, kmean.transpose(-1, -2)) / math.sqrt(d)
    logits = logits.masked_fill(~real[:, :, None, :], float("-inf"))
    return torch.softmax(logits, dim=-1).nan_to_num(0.0).sum(2)


@dataclass
class NSAPolicy(PageSelector):
    """Reads sink and window pages, the best pages by compressed attention and one
    mean-pooled row per other page, within `budget` keys per lane per step; evicts nothing."""

    name: ClassVar[str] = "nsa"
    paper: ClassVar[str] = "NSA: compressed + selected + window (Yuan et al., 2025)"
    window: int = 64  # recent tokens read in full, rounded up to whole pages

    def check(self) -> None:
        super().check()
        if self.window < 1:
            raise CtxlabError(f"window must be >= 1 token, got {self.window}.")

    def window_pages(self, page: int) -> int:
        return max(1, -(-self.window // page))

    def forced_pages(self, page: int) -> int:
        return self.sink_pages + self.window_pages(page)

    def choose_pages(self, obs: PageObs) -> PageChoice:
        kmean = obs.need("kmean")
        nb = kmean.shape[2]
        page = obs.page
        if page < 2:
            raise RuntimeError("nsa needs the page size (PageObs.page) of at least 2 tokens")
        real, forced = self.forced(obs, nb)
        page_idx = torch.arange(nb, device=real.device)
        forced |= real & (page_idx >= obs.have[..., None] - self.window_pages(page))
        keys = (obs.pages * page).view(-1, 1)  # [B, 1] keys each row may read
        room = torch.div(keys - obs.have, page - 1, rounding_mode="floor")  # pages in full
        n_forced = forced.sum(-1)
        limit = torch.maximum(room, n_forced)  # selected = limit - forced, never below 0
        choice = self.pick(compressed_probs(obs.query, kmean, real), real, forced, limit)
        read = torch.zeros_like(real).scatter_(-1, choice.pages, choice.ok)
        choice.compressed = real & ~read
        return choice
