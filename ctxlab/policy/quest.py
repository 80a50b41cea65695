"""`quest`: query-aware page selection (selection, not eviction: everything stays cached).

Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference" (ICML
2024, arXiv:2406.10774). Parameters copied: a page's summary is the per-channel minimum and
maximum of its keys; for a query q, sum_c max(q_c * min_c, q_c * max_c) is an upper bound of
q . k for every key k of the page; each decode step attends only to the top pages by that
bound. Here pages are the engine's blocks (the engine keeps each block's key summary as
keys are written and shows them in a `PageObs`), the bound is taken per KV head (the max
over the query heads of its GQA group, so every head's best page counts), and the first
page (the sinks) and the current (last) page are always read. `budget` is the tokens read
per step per lane.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.policy.observation import PageChoice, PageObs
from ctxlab.policy.page_select import PageSelector


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


@dataclass
class QuestPolicy(PageSelector):
    """Reads `budget // page` pages per lane per decode step; evicts nothing.

    `budget` is tokens or a share of each sequence's prompt, never fewer pages than the
    sink pages plus the current one. The page size is the engine's block size."""

    name: ClassVar[str] = "quest"
    paper: ClassVar[str] = "Quest: query-aware sparsity (Tang et al., ICML 2024)"
    needs: ClassVar[frozenset[str]] = frozenset({"pages", "page_bounds"})

    def choose_pages(self, obs: PageObs) -> PageChoice:
        """Pages `[B, n_kv, P]` sorted, `ok [B, n_kv, P]` (the slot is a real page in the row's
        budget) for every decode row and lane at once; P is the most pages any row reads.

        The bound sum_c max(q_c min_c, q_c max_c) is q+ . max + q- . min (q+ and q- the
        positive and negative parts of q): two matmuls, then the best head of each group.
        """
        qg = obs.query
        kmin, kmax = obs.need("kmin"), obs.need("kmax")
        bound = torch.matmul(qg.clamp(min=0), kmax.transpose(-1, -2))
        bound = bound + torch.matmul(qg.clamp(max=0), kmin.transpose(-1, -2))
        real, forced = self.forced(obs, kmin.shape[2])
        limit = obs.pages.view(-1, 1).expand_as(obs.have)
        return self.pick(bound.amax(2), real, forced, limit)
