"""Sharing layer: the ideal saving when N requests share the same S-token prefix.

One copy of the prefix's cache serves every request, so sharing avoids (N - 1) copies of
the prefix bytes. That holds for layers that keep every token (full, MLA). A sliding layer
only holds the part of the prefix still inside its window, so at long contexts the prefix
has left the window and sharing saves nothing there. A recurrent layer's state mixes the
prefix with everything after it, so each request owns its state: sharing saves prefill
compute there, not memory. Paged caches share only full pages; the partial last page of the
prefix stays private, which `bytes_avoided_full_pages` reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxlab.arch.spec import ArchSpec, LayerSpec
from ctxlab.errors import CtxlabError
from ctxlab.plan.units import whole_bytes


def shared_resident_tokens(layer: LayerSpec, context: int, prefix: int) -> int:
    """Prefix tokens this layer still holds for a request of `context` tokens."""
    prefix = min(prefix, context)
    if layer.kind in ("full", "mla"):
        return prefix
    if layer.kind == "sliding":
        assert layer.window is not None
        window_start = max(0, context - layer.window)
        return max(0, prefix - window_start)
    return 0


def shared_bytes(arch: ArchSpec, context: int, prefix: int) -> int:
    """Bytes of one request's cache that belong to the shared prefix (one copy)."""
    return sum(
        whole_bytes(
            layer.elements_per_token()
            * shared_resident_tokens(layer, context, prefix)
            * arch.cache_dtype_bytes
        )
        for layer in arch.layers
    )


@dataclass(frozen=True)
class SharingResult:
    context: int
    requests: int
    prefix_tokens: int
    bytes_without_sharing: int
    bytes_avoided: int
    bytes_avoided_full_pages: int

    @property
    def bytes_with_sharing(self) -> int:
        return self.bytes_without_sharing - self.bytes_avoided


def prefix_sharing(
    arch: ArchSpec, context: int, requests: int, prefix: int, page_size: int | None = None
) -> SharingResult:
    """Ideal saving of `requests` requests of `context` tokens sharing `prefix` tokens."""
    if context <= 0:
        raise CtxlabError(f"context length must be a positive number of tokens, got {context}")
    if requests <= 0:
        raise CtxlabError(f"the number of requests must be positive, got {requests}")
    if prefix < 0:
        raise CtxlabError(f"shared prefix length must be zero or positive, got {prefix}")
    if page_size is not None and page_size <= 0:
        raise CtxlabError(f"page size must be a positive number of tokens, got {page_size}")
    copies = requests - 1
    paged_prefix = prefix if page_size is None else (min(prefix, context) // page_size) * page_size
    return SharingResult(
        context=context,
        requests=requests,
        prefix_tokens=min(prefix, context),
        bytes_without_sharing=requests * arch.request_bytes(context),
        bytes_avoided=copies * shared_bytes(arch, context, prefix),
        bytes_avoided_full_pages=copies * shared_bytes(arch, context, paged_prefix),
    )
