"""`moba`: block top-k by mean key (selection, not eviction: everything stays cached).

Lu et al., "MoBA: Mixture of Block Attention for Long-Context LLMs" (Moonshot AI, 2025,
arXiv:2502.13189). Parameters copied: the context is split into blocks; a query scores each
block by its affinity with the block's MEAN key, s = q . mean(K_block); it attends to the
top-k blocks plus its own (current) block. Here blocks are the engine's pages (the engine
keeps each page's key mean beside the pool as keys are written), the score is taken per KV
head as the best (max) over the query heads of its GQA group, as Quest does (MoBA gates each
query head on its own; a KV-head lane is read once for its whole group), and k is
`budget // page - forced pages`, so `budget` is the keys read per step. MoBA forces only the
current block; `sink_pages=1` (the default here, as Quest) also reads the first page, where
the models we run put their attention sinks; `sink_pages=0` is MoBA's own rule. MoBA is
trained with its block attention; this applies the rule to a model trained densely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.policy.observation import PageChoice, PageObs
from ctxlab.policy.page_select import PageSelector


def mean_key_scores(query: torch.Tensor, kmean: torch.Tensor) -> torch.Tensor:
    """q . mean(K) of every page, best head of each group: `[B, n_kv, g, d]` and
    `[B, n_kv, nb, d]` -> `[B, n_kv, nb]`."""
    return torch.matmul(query, kmean.transpose(-1, -2)).amax(2)


@dataclass
class MoBAPolicy(PageSelector):
    """Reads the current page, the sink pages and the best pages by q . mean key, up to
    `budget` keys per lane per decode step; evicts nothing."""

    name: ClassVar[str] = "moba"
    paper: ClassVar[str] = "MoBA: block top-k by mean key (Lu et al., 2025)"

    def choose_pages(self, obs: PageObs) -> PageChoice:
        kmean = obs.need("kmean")
        real, forced = self.forced(obs, kmean.shape[2])
        limit = obs.pages.view(-1, 1).expand_as(obs.have)
        return self.pick(mean_key_scores(obs.query, kmean), real, forced, limit)
