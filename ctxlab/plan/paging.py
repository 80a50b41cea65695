"""Allocation layer: what a paged cache really reserves for a request.

A paged allocator hands out whole pages of `page_size` token slots, so a request of n tokens
holds ceil(n/P)*P slots; the tail of the last page is waste, always less than one page.
Sliding layers free whole pages once every token in them has left the window, so their
resident window may straddle one more page than W/P, and the slots they hold go up and down
as the window slides. Capacity must reserve the peak a request reaches on its way to its
length, which `peak_allocated_bytes` reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from ctxlab.arch.spec import ArchSpec, LayerSpec
from ctxlab.errors import CtxlabError
from ctxlab.plan.parallel import replication
from ctxlab.plan.units import whole_bytes


def _check(tokens: int, page_size: int) -> None:
    if page_size <= 0:
        raise CtxlabError(f"page size must be a positive number of tokens, got {page_size}")
    if tokens < 0:
        raise CtxlabError(f"token count must be non-negative, got {tokens}")


def allocated_slots(tokens: int, page_size: int) -> int:
    """Slots a request of `tokens` holds: ceil(tokens / P) * P."""
    _check(tokens, page_size)
    return -(-tokens // page_size) * page_size


def wasted_slots(tokens: int, page_size: int) -> int:
    return allocated_slots(tokens, page_size) - tokens


def layer_allocated_slots(layer: LayerSpec, context: int, page_size: int) -> int:
    """Slots one layer holds for a request of `context` tokens.

    A sliding layer keeps positions [context - W, context); the pages that cover them run
    from floor((context - W) / P) to floor((context - 1) / P).
    """
    _check(context, page_size)
    if layer.kind in ("full", "mla"):
        return allocated_slots(context, page_size)
    if layer.kind == "sliding":
        assert layer.window is not None
        if context <= layer.window:
            return allocated_slots(context, page_size)
        first = (context - layer.window) // page_size
        last = (context - 1) // page_size
        return (last - first + 1) * page_size
    return 0


@lru_cache(maxsize=4096)
def _sliding_peak(window: int, context: int, page_size: int) -> int:
    layer = LayerSpec("sliding", kv_heads=1, d_k=1, d_v=1, window=window)
    if context <= window:
        return allocated_slots(context, page_size)
    # Past the window the slot count is periodic in the context with period P.
    start = max(window + 1, context - page_size + 1)
    peak = max(layer_allocated_slots(layer, c, page_size) for c in range(start, context + 1))
    return max(peak, allocated_slots(window, page_size))


def layer_peak_slots(layer: LayerSpec, context: int, page_size: int) -> int:
    """Most slots this layer holds at any length up to `context` (what capacity must reserve)."""
    _check(context, page_size)
    if layer.kind == "sliding":
        assert layer.window is not None
        return _sliding_peak(layer.window, context, page_size)
    return layer_allocated_slots(layer, context, page_size)


@dataclass(frozen=True)
class PagedRequest:
    """One request's page-rounded allocation at one context length."""

    context: int
    page_size: int
    allocated_tokens: int
    wasted_tokens: int
    logical_bytes: int
    allocated_bytes: int
    peak_allocated_bytes: int
    gpus: int = 1
    peak_bytes_all_gpus: int = 0  # peak, with tensor-parallel copies (see `parallel`)

    @property
    def wasted_bytes(self) -> int:
        return self.allocated_bytes - self.logical_bytes


def paged_request(arch: ArchSpec, context: int, page_size: int, gpus: int = 1) -> PagedRequest:
    """Allocated and wasted slots (tokens of a full layer) and bytes over all layers.

    Fixed recurrent state is not paged here: it is counted once, at its logical size.
    With `gpus` tensor-parallel ranks, `peak_bytes_all_gpus` adds the copies.
    """
    _check(context, page_size)
    dtype = arch.cache_dtype_bytes
    allocated_bytes = peak_bytes = 0
    all_gpus = Fraction(0)
    for layer in arch.layers:
        per_slot = layer.elements_per_token() * dtype
        fixed = layer.fixed_bytes(dtype)
        allocated_bytes += whole_bytes(per_slot * layer_allocated_slots(layer, context, page_size))
        allocated_bytes += fixed
        peak = whole_bytes(per_slot * layer_peak_slots(layer, context, page_size)) + fixed
        peak_bytes += peak
        all_gpus += peak * replication(layer, gpus)
    return PagedRequest(
        context=context,
        page_size=page_size,
        allocated_tokens=allocated_slots(context, page_size),
        wasted_tokens=wasted_slots(context, page_size),
        logical_bytes=arch.request_bytes(context),
        allocated_bytes=allocated_bytes,
        peak_allocated_bytes=peak_bytes,
        gpus=gpus,
        peak_bytes_all_gpus=math.ceil(all_gpus),
    )
