"""Capacity: how many requests of a given length the cache pool can hold at once.

The pool is what is left of device memory after the weights and a runtime reserve
(activations, CUDA graphs, fragmentation). Requests are counted at their page-rounded size
at their end (context plus generated tokens), because that is what an allocator must find
free before a request finishes.
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


MAX_GPUS = 4096  # a search bound: no single model instance spans more devices


def reserve_for(memory_bytes: int, reserve_bytes: int | None, fraction: float) -> int:
    """The runtime reserve: as given, or a fraction of the memory of all devices."""
    return reserve_bytes if reserve_bytes is not None else int(memory_bytes * fraction)


def gpus_for_weights(
    device_memory: int, weights_bytes: int, reserve_bytes: int | None, fraction: float
) -> int | None:
    """Fewest devices whose memory holds the weights plus the reserve with room left for a
    KV cache; None when no count up to MAX_GPUS does."""
    for n in range(1, MAX_GPUS + 1):
        memory = device_memory * n
        if weights_bytes + reserve_for(memory, reserve_bytes, fraction) < memory:
            return n
    return None


def no_room(
    name: str,
    weights_bytes: int,
    weights_label: str,
    reserve_bytes: int,
    gpus: int,
    device_name: str,
    device_memory: int,
    need: int | None,
) -> CtxlabError:
    """One sentence for weights that do not fit, naming the device count that would hold them."""
    fix = (
        f"{need} x {device_name} would hold them (--gpus {need}, or leave --gpus out to plan on "
        "the fewest that do)"
        if need is not None
        else f"no count up to {MAX_GPUS:,} devices holds them; check --weights-bytes"
    )
    return CtxlabError(
        f"{name} weights ({fmt_bytes(weights_bytes)}{weights_label}) plus the reserve "
        f"({fmt_bytes(reserve_bytes)}) leave no room for a KV cache on {gpus} x {device_name} "
        f"({fmt_bytes(device_memory * gpus)}); {fix}."
    )


def max_concurrent(budget_bytes: int, bytes_per_request: int) -> int | None:
    """Requests that fit at once; None when a request holds no cache (memory does not bound)."""
    if bytes_per_request <= 0:
        return None
    return budget_bytes // bytes_per_request


def capacity_sentence(
    fits: int | None,
    context: int,
    bytes_per_request: int,
    budget_bytes: int,
    gpus: int = 1,
    generated: int = 0,
) -> str:
    """Say it plainly: 'one fits, two do not'. `context` counts every token a request holds
    at its end: the `generated` ones are part of it, and said so."""
    if fits is None:
        return f"Requests of {context:,} tokens hold no cache, so memory does not limit them."
    parts = [f"all {gpus} GPUs"] if gpus > 1 else []
    if generated:
        parts.insert(0, f"{context - generated:,} context + {generated:,} generated")
    head = (
        f"With {fmt_bytes(budget_bytes)} for KV and {fmt_bytes(bytes_per_request)} per "
        f"request of {context:,} tokens" + (f" ({', '.join(parts)})" if parts else "")
    )
    if fits == 0:
        return f"{head}, not even one fits."
    verb = "fits" if fits == 1 else "fit"
    return f"{head}: {count_word(fits)} {verb}, {count_word(fits + 1)} do not."
