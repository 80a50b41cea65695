"""`quest`: query-aware page selection (selection, not eviction: everything stays cached).

Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference" (ICML
2024, arXiv:2406.10774). Parameters copied: a page's summary is the per-channel minimum and
maximum of its keys; for a query q, sum_c max(q_c * min_c, q_c * max_c) is an upper bound of
q . k for every key k of the page; each decode step attends only to the top pages by that
bound. Here pages are the pool's blocks, the bound is taken per KV head (the max over the
query heads of its GQA group, so every head's best page counts), and the first page (the
sinks) and the current (last) page are always read. `budget` is the tokens read per
step per lane.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.errors import CtxlabError
from ctxlab.policy.base import Policy, group_reduce
from ctxlab.policy.budget import TOKENS_512, Budget


def page_summaries(
    keys: torch.Tensor, lens: torch.Tensor, page: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-page channel min and max `[n_kv, P, d]` of lanes `keys [n_kv, L, d]`.

    Slots at or past a lane's length do not count; a page with no real slot gets +inf/-inf
    (an empty range whose bound is -inf).
    """
    n_kv, length, d = keys.shape
    n_pages = -(-length // page)
    pad = n_pages * page - length
    k = torch.nn.functional.pad(keys.float(), (0, 0, 0, pad))
    valid = torch.arange(n_pages * page, device=keys.device)[None, :] < lens[:, None]
    kmin = k.masked_fill(~valid[..., None], float("inf")).view(n_kv, n_pages, page, d).amin(2)
    kmax = k.masked_fill(~valid[..., None], float("-inf")).view(n_kv, n_pages, page, d).amax(2)
    return kmin, kmax


def page_bound(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Upper bound of q . k per page: q `[H, d]`, summaries `[n_kv, P, d]` -> `[H, P]`."""
    n_heads = q.shape[0]
    g = n_heads // kmin.shape[0]
    lo = kmin.repeat_interleave(g, dim=0)
    hi = kmax.repeat_interleave(g, dim=0)
    qf = q.float()[:, None, :]
    prod = torch.maximum(qf * lo, qf * hi)
    empty = torch.isinf(lo).all(dim=-1)
    return prod.nan_to_num(0.0).sum(-1).masked_fill(empty, float("-inf"))


def select_pages(
    q: torch.Tensor,
    kmin: torch.Tensor,
    kmax: torch.Tensor,
    lens: torch.Tensor,
    page: int,
    n_pages: int,
    sink_pages: int = 1,
) -> list[torch.Tensor]:
    """Sorted page indices each KV head reads: sinks, the current page, then top bounds."""
    bound = group_reduce(page_bound(q, kmin, kmax), kmin.shape[0], "max")  # [n_kv, P]
    out = []
    for h in range(kmin.shape[0]):
        have = -(-int(lens[h]) // page)
        if have <= n_pages:
            out.append(torch.arange(have))
            continue
        s = bound[h, :have].clone()
        s[: min(sink_pages, have)] = float("inf")
        s[have - 1] = float("inf")
        top = torch.topk(s, n_pages).indices
        out.append(torch.sort(top).values)
    return out


@dataclass
class QuestPolicy(Policy):
    """Reads `budget // page` pages per lane per decode step; evicts nothing.

    `budget` is tokens or a share of each sequence's prompt, never fewer pages than the
    sink pages plus the current one."""

    name: ClassVar[str] = "quest"
    paper: ClassVar[str] = "Quest: query-aware sparsity (Tang et al., ICML 2024)"
    stack_layer: ClassVar[str] = "selection"
    needs: ClassVar[frozenset[str]] = frozenset({"query"})
    budget: Budget = TOKENS_512
    page: int = 16
    sink_pages: int = 1

    def __post_init__(self) -> None:
        self.budget = Budget.parse(self.budget)

    def pages_per_step(self, prompt_len: int | None = None) -> int:
        """Pages each lane reads per step (a ratio budget needs the sequence's prompt length)."""
        if self.budget.is_ratio:
            if prompt_len is None:
                raise ValueError("a ratio budget needs the prompt length")
            tokens = self.budget.tokens_for(prompt_len)
            return max(self.sink_pages + 1, tokens // self.page)
        return max(1, self.budget.tokens_for(0) // self.page)

    def check(self) -> None:
        super().check()
        if self.budget.is_ratio:
            return  # sized per sequence, at least the sink pages and the current one
        if self.pages_per_step() < self.sink_pages + 1:
            raise CtxlabError(
                f"a Quest budget of {self.budget} tokens is too small: it must hold "
                f"{self.sink_pages} sink page(s) and the current page of {self.page} tokens."
            )


def read_fraction(pages: list[torch.Tensor], lens: torch.Tensor, page: int) -> float:
    """Fraction of stored KV bytes (whole pages) a step reads when it reads `pages`."""
    read = sum(int(p.numel()) for p in pages)
    total = sum(-(-int(n) // page) for n in lens)
    return read / total if total else 1.0
