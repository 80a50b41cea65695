"""Torch threads per step, by phase: a decode-only step runs on one thread by default.

A batch-1 decode step is some 4,000 small operators on one token each; split over two
threads, each pays a wake-up and a join that cost more than the half it saves (docs/decode.md:
int8 batch-1 decode 31 tok/s on 2 threads against 95 on 1, and batch-16 decode 283 against
316). A step that prefills (hundreds of tokens per operator) gains from every thread. So a
step whose tokens are all decode tokens, fewer than `DECODE_ALL_THREADS_FROM`, runs on
`CTXLAB_DECODE_THREADS` threads (default 1); every other step runs on the count torch was
given (`--threads`, or torch's default), which is restored after the step.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ctxlab.errors import CtxlabError

ENV = "CTXLAB_DECODE_THREADS"
DECODE_ALL_THREADS_FROM = 64  # decode tokens per step from which every thread is used


def decode_threads() -> int:
    """Threads of a small decode-only step: `CTXLAB_DECODE_THREADS` (0: torch's count), 1."""
    raw = os.environ.get(ENV, "1").strip()
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise CtxlabError(f"{ENV} must be a whole number of threads (0: all), got {raw!r}.")
    return n


def threads_for(decode_tokens: int, prefill_tokens: int, configured: int) -> int:
    """Threads for a step of this shape, given the configured count."""
    if prefill_tokens or decode_tokens >= DECODE_ALL_THREADS_FROM:
        return configured
    n = decode_threads()
    return configured if n == 0 else min(n, configured)


@contextmanager
def step_threads(decode_tokens: int, prefill_tokens: int) -> Iterator[int]:
    """Run the body on the step's thread count; the configured count is restored after."""
    configured = torch.get_num_threads()
    n = threads_for(decode_tokens, prefill_tokens, configured)
    if n == configured:
        yield n
        return
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(configured)
