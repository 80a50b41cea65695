"""Capacity: how many requests of a given length the cache pool can hold at once.

The pool is what is left of device memory after the weights and a runtime reserve
(activations, CUDA graphs, fragmentation). Requests are counted at their page-rounded size,
because that is what an allocator must find free.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxlab.errors import CtxlabError
from ctxlab.plan.units import count_word, fmt_bytes


@dataclass(frozen=True)
class KVBudget:
    memory_bytes: int
    weights_bytes: int
    reserve_bytes: int

    @property
    def kv_bytes(self) -> int:
        return self.memory_bytes - self.weights_bytes - self.reserve_bytes


def kv_budget(memory_bytes: int, weights_bytes: int, reserve_bytes: int) -> KVBudget:
    """Device memory minus weights minus reserve; no room left is a user mistake."""
    if weights_bytes < 0 or reserve_bytes < 0:
        raise CtxlabError(
            f"weights and reserve must be zero or positive bytes, got {weights_bytes} "
            f"and {reserve_bytes}"
        )
    if weights_bytes + reserve_bytes >= memory_bytes:
        raise CtxlabError(
            f"weights ({fmt_bytes(weights_bytes)}) plus reserve ({fmt_bytes(reserve_bytes)}) "
            f"leave no room for a KV cache on a device of {fmt_bytes(memory_bytes)}"
        )
    return KVBudget(memory_bytes, weights_bytes, reserve_bytes)


def max_concurrent(budget_bytes: int, bytes_per_request: int) -> int | None:
    """Requests that fit at once; None when a request holds no cache (memory does not bound)."""
    if bytes_per_request <= 0:
        return None
    return budget_bytes // bytes_per_request


def capacity_sentence(
    fits: int | None, context: int, bytes_per_request: int, budget_bytes: int, gpus: int = 1
) -> str:
    """Say it plainly: 'one fits, two do not'."""
    if fits is None:
        return f"Requests of {context:,} tokens hold no cache, so memory does not limit them."
    head = (
        f"With {fmt_bytes(budget_bytes)} for KV and {fmt_bytes(bytes_per_request)} per "
        f"request of {context:,} tokens" + (f" (all {gpus} GPUs)" if gpus > 1 else "")
    )
    if fits == 0:
        return f"{head}, not even one fits."
    verb = "fits" if fits == 1 else "fit"
    return f"{head}: {count_word(fits)} {verb}, {count_word(fits + 1)} do not."
