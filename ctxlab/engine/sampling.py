"""Sampling parameters and the sampler.

Each request samples with its own `torch.Generator` seeded from `seed`, so its output does
not depend on what else shares the batch. Temperature 0 is greedy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_seed


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1): off
    seed: int | None = None
    stop: tuple[str, ...] | list[str] = field(default_factory=tuple)
    ignore_eos: bool = False
    # Score the prompt: log-probability of each prompt token given the ones before it, as
    # the cache (and any policy) saw them. Used by streaming perplexity.
    prompt_logprobs: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise CtxlabError(f"max_tokens must be a positive integer, got {self.max_tokens!r}.")
        if not 0 <= self.temperature < math.inf:
            raise CtxlabError(f"temperature must be >= 0 and finite, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise CtxlabError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise CtxlabError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k}.")
        if self.seed is not None:
            check_seed(self.seed, "seed")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    g = torch.Generator()
    g.manual_seed(params.seed if params.seed is not None else torch.seed())
    return g


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """One token per row of `logits` [S, vocab]."""
    logits = logits.float()
    out = greedy_tokens(logits)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = logits[i] / p.temperature
        if p.top_k > 0 and p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            drop = cum - sorted_p > p.top_p  # keep the smallest set reaching top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        out[i] = int(torch.multinomial(probs, 1, generator=generators[i]))
    return out


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """The index of each row's largest logit: the first one on ties, a NaN counted as the
    largest (torch's and numpy's rule). On the CPU through numpy, whose argmax is
    vectorized where torch's is not: 9.6 against 245 us for 4 rows of 49,152 (AMX machine,
    1 thread); a 4-sequence int8 decode step of SmolLM2 25.07 -> 24.88 ms."""
    if logits.device.type == "cpu" and logits.dim() == 2:
        return logits.detach().contiguous().numpy().argmax(axis=1).tolist()
    return logits.argmax(dim=-1).tolist()
