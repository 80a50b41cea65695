"""The part every block/token selector shares (Quest, MoBA, DSA, NSA): a read budget,
forced pages and one deterministic top-k over pages.

A selector evicts nothing: the engine keeps every block and each decode step reads only
what the policy picks (`choose_pages` answers a `PageChoice`). `budget` is the KEYS READ per
step per lane (tokens, or a share of each sequence's prompt), so selectors with different
rules (whole pages, single tokens, mean-pooled rows) are compared at equal keys read with
Quest (`budget // page` pages) and with the full cache. The first `sink_pages` pages
(attention sinks) and the current page (the newest keys, whose summaries the engine folds in
after the step) are always read. Ties are broken by `ranking.top_indices` (higher score
first, then the lower index), so a choice never depends on the CPU's instruction set when
the scores agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.errors import CtxlabError
from ctxlab.policy.base import Policy, StackLayer
from ctxlab.policy.budget import TOKENS_512, Budget
from ctxlab.policy.observation import PageChoice, PageObs
from ctxlab.policy.ranking import top_indices


@dataclass
class PageSelector(Policy):
    """Reads at most `budget` keys per lane per decode step; evicts nothing."""

    stack_layer: ClassVar[StackLayer] = "selection"
    needs: ClassVar[frozenset[str]] = frozenset({"pages", "page_means"})
    budget: Budget = TOKENS_512
    sink_pages: int = 1

    def __post_init__(self) -> None:
        self.budget = Budget.parse(self.budget)

    def check(self) -> None:
        super().check()
        if self.sink_pages < 0:
            raise CtxlabError(f"sink_pages must be >= 0, got {self.sink_pages}.")

    def forced_pages(self, page: int) -> int:
        """Pages every step reads whatever the scores: the sinks and the current page."""
        return self.sink_pages + 1

    def check_page(self, page: int) -> None:
        """One sentence when a token budget cannot hold the pages every step must read."""
        need = self.forced_pages(page)
        if not self.budget.is_ratio and self.pages_per_step(0, page) < need:
            raise CtxlabError(
                f"a {self.name} budget of {self.budget} keys read per step is too small: it "
                f"must hold {need} page(s) of {page} tokens that every step reads "
                f"({self.sink_pages} sink page(s), the current page and any window)."
            )

    def pages_per_step(self, prompt_len: int, page: int) -> int:
        """The budget in pages of `page` tokens (keys read per step = this x page)."""
        tokens = self.budget.tokens_for(prompt_len)
        if self.budget.is_ratio:
            return max(self.forced_pages(page), tokens // page)
        return max(1, tokens // page)

    def forced(self, obs: PageObs, nb: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(`real [B, n_kv, nb]`: the lane holds the page, `forced`: it is always read)."""
        page_idx = torch.arange(nb, device=obs.have.device)
        have = obs.have[..., None]
        real = page_idx < have
        return real, real & ((page_idx < self.sink_pages) | (page_idx == have - 1))

    def pick(
        self, score: torch.Tensor, real: torch.Tensor, forced: torch.Tensor, limit: torch.Tensor
    ) -> PageChoice:
        """The `limit [B, n_kv]` best pages of each lane by `score [B, n_kv, nb]`, forced
        pages first, as a `PageChoice` (pages sorted ascending)."""
        s = score.float().masked_fill(~real, float("-inf")).masked_fill(forced, float("inf"))
        P = max(1, min(int(limit.max()), s.shape[-1]))
        top = top_indices(s, P)  # best first, ties by page index
        in_budget = torch.arange(P, device=top.device) < limit[..., None]
        top, order = torch.sort(top, dim=-1)
        ok = torch.gather(real, -1, top) & torch.gather(in_budget, -1, order)
        return PageChoice(top, ok)
