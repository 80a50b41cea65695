"""`dsa`: token top-k by a cheap indexer (selection, not eviction: everything stays cached).

DeepSeek-AI, "DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency with DeepSeek Sparse
Attention" (2025). Parameters copied: a light "lightning indexer" scores every preceding
token for the current query, and attention reads only the top-k tokens (2,048 in the
paper); the indexer keeps its own small key per token beside the cache, read in full every
step, so the cost of choosing grows with the context but is far below reading the keys.

THE INDEXER HERE IS NOT DEEPSEEK'S. Theirs is a trained light attention (its own query and
key projections, FP8, per-head ReLU scores mixed by learned weights). Ours is untrained: a
fixed random Gaussian projection R `[d, index_dim]` (seeded by `seed`, scaled by
1/sqrt(index_dim), so E[(qR) . (kR)] = q . k: a Johnson-Lindenstrauss sketch) applied to
the keys as they are written (`index_keys`, kept by the engine beside the pool: index_dim
floats per token) and to the query at each step; a token's score is the best (max) over
the query heads of its GQA group of (qR) . (kR). It is an approximation of the idea (pick
tokens by a cheap estimate of q . k), not of the trained indexer's quality.

`budget` is the keys read per step per lane: the sink pages and the current page (whose
newest key has no index key yet) are read in full, and the remaining keys are the best
tokens by the indexer, read one by one.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.errors import CtxlabError
from ctxlab.policy.observation import PageChoice, PageObs
from ctxlab.policy.page_select import PageSelector
from ctxlab.policy.ranking import top_mask


@functools.lru_cache(maxsize=64)
def random_projection(d: int, r: int, seed: int, device: str) -> torch.Tensor:
    """A fixed Gaussian `[d, r]` scaled by 1/sqrt(r): the same seed gives the same matrix
    on every machine (drawn on the CPU generator, then moved)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(d, r, generator=g) / math.sqrt(r)).to(device)


@dataclass
class DSAPolicy(PageSelector):
    """Reads the sink and current pages plus the best tokens by a random-projection
    indexer, up to `budget` keys per lane per decode step; evicts nothing."""

    name: ClassVar[str] = "dsa"
    paper: ClassVar[str] = "DSA: token top-k, untrained indexer (DeepSeek, 2025)"
    needs: ClassVar[frozenset[str]] = frozenset({"pages", "index_keys"})
    index_dim: int = 16
    seed: int = 0

    def check(self) -> None:
        super().check()
        if self.index_dim < 1:
            raise CtxlabError(f"index_dim must be >= 1, got {self.index_dim}.")

    def projection(self, d: int, device: torch.device) -> torch.Tensor:
        """The fixed indexer projection `[d, index_dim]` (the same for every layer)."""
        return random_projection(d, self.index_dim, self.seed, str(device))

    def index_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Indexer keys `[..., index_dim]` of keys `[..., d]` as written (float32)."""
        return torch.matmul(keys.float(), self.projection(keys.shape[-1], keys.device))

    def index_scores(self, query: torch.Tensor, ikeys: torch.Tensor) -> torch.Tensor:
        """(qR) . (kR), best head of each group: `[B, n_kv, g, d]`, `[B, n_kv, L, r]` ->
        `[B, n_kv, L]`."""
        qi = torch.matmul(query.float(), self.projection(query.shape[-1], query.device))
        return torch.matmul(qi, ikeys.transpose(-1, -2)).amax(2)

    def choose_pages(self, obs: PageObs) -> PageChoice:
        ikeys, lens = obs.need("ikeys"), obs.need("lens")
        page = obs.page
        nb = -(-ikeys.shape[2] // page) if page else 0
        if page < 1 or nb * page != ikeys.shape[2]:
            raise RuntimeError("dsa needs the page size (PageObs.page) of the indexer keys")
        real, forced = self.forced(obs, nb)
        n_forced = forced.sum(-1)
        choice = self.pick(torch.zeros_like(real, dtype=torch.float32), real, forced, n_forced)
        slot = torch.arange(nb * page, device=lens.device)
        in_forced = forced.repeat_interleave(page, dim=-1)
        score = self.index_scores(obs.query, ikeys)
        score = score.masked_fill(in_forced | (slot >= lens[..., None]), float("-inf"))
        n_tok = (obs.pages * page).view(-1, 1) - n_forced * page  # [B, n_kv]
        L = nb * page
        K = max(1, min(int(n_tok.max()), L))
        chosen = top_mask(score, n_tok.clamp(min=0)) & (score > float("-inf"))
        # the chosen slots packed in ascending order (each to its rank among the chosen;
        # the others all land in a spare last column, dropped)
        rank = torch.where(chosen, chosen.cumsum(-1) - 1, K)
        tokens = torch.zeros(*chosen.shape[:-1], K + 1, dtype=torch.int64, device=slot.device)
        tokens.scatter_(-1, rank, slot.expand_as(rank))
        choice.tokens = tokens[..., :K]
        choice.tokens_ok = torch.arange(K, device=slot.device) < chosen.sum(-1, keepdim=True)
        return choice
