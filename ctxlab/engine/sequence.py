"""Per-request state: tokens, how many of them are in the cache, timings.

`num_computed` counts tokens whose K/V is in the pool. A token is sampled when a step
brings `num_computed` up to `num_tokens`. Preemption frees the blocks and sets
`num_computed` back to 0: the request is recomputed from prompt + output so far, so it is
neither dropped nor answered differently. A request that fails inside a step carries a
`RequestError` and finishes with reason "error"; an aborted one finishes with "abort".

A request added with `hold` keeps its cache when it ends (stop or length), as its policy left
it; `LLMEngine.follow_up` appends a new turn's tokens and runs it again on that cache (the
turn's prompt is everything so far), and `LLMEngine.release` frees it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from ctxlab.engine.metrics import RequestMetrics
from ctxlab.engine.sampling import SamplingParams
from ctxlab.kv.seq_kv import SeqKV


@dataclass(frozen=True)
class RequestError:
    """Why a request failed inside a step: one sentence, and whose fault it was.

    `user_fault` is True for a `CtxlabError` (the request cannot work: a server answers 400)
    and False for anything else (the engine failed on it: 500).
    """

    message: str
    user_fault: bool


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    kv: SeqKV
    metrics: RequestMetrics
    cache_salt: str | None = None
    token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    text: str = ""  # detokenized output so far (after stop-string truncation)
    admitted: bool = False
    error: RequestError | None = None
    # keep the cache when the request ends (stop or length), for `LLMEngine.follow_up`
    hold: bool = False
    # prompt_logprobs[i] = log p(prompt[i + 1] | prompt[: i + 1]); None until computed
    prompt_logprobs: list[float | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt :]

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
