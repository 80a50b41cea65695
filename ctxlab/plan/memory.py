"""Representation layer: logical KV bytes per token, per request and for a whole batch.

"Logical" means the bytes the model's state needs, before any allocator rounds them into
pages (see `paging`). Sliding layers stop growing at their window and recurrent layers hold
a fixed state, so per-request bytes are computed layer by layer, never as per-token bytes
times length.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError

# Cache element widths in bytes; a 4-bit cache packs two elements per byte.
CACHE_DTYPES: dict[str, float] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}


def cache_dtype_bytes(name: str) -> float:
    """Width of one cache element for a dtype name such as 'fp8'."""
    key = name.strip().lower()
    if key not in CACHE_DTYPES:
        raise CtxlabError(
            f"unknown cache dtype {name!r}; known cache dtypes: {', '.join(CACHE_DTYPES)}"
        )
    return CACHE_DTYPES[key]


def with_cache_dtype(arch: ArchSpec, name: str | None) -> ArchSpec:
    """The same architecture with its cache stored in another dtype (None keeps it)."""
    return arch if name is None else arch.with_cache_dtype(cache_dtype_bytes(name))


@dataclass(frozen=True)
class RequestMemory:
    """Logical cache bytes of one request at one context length, and of `concurrency` of them."""

    context: int
    bytes_per_request: int
    bytes_by_kind: dict[str, int]
    concurrency: int

    @property
    def bytes_for_concurrency(self) -> int:
        return self.bytes_per_request * self.concurrency


def kv_bytes_per_token(arch: ArchSpec) -> int:
    """Bytes one more retained token costs summed over the token-growing layers."""
    return arch.kv_bytes_per_token()


def kv_bytes_per_token_by_kind(arch: ArchSpec) -> dict[str, int]:
    return arch.kv_bytes_per_token_by_kind()


def request_memory(arch: ArchSpec, context: int, concurrency: int = 1) -> RequestMemory:
    """Per-request and whole-batch logical bytes at `context` tokens."""
    if context <= 0:
        raise CtxlabError(f"context length must be a positive number of tokens, got {context}")
    if concurrency <= 0:
        raise CtxlabError(f"concurrency must be a positive number of requests, got {concurrency}")
    return RequestMemory(
        context=context,
        bytes_per_request=arch.request_bytes(context),
        bytes_by_kind=arch.request_bytes_by_kind(context),
        concurrency=concurrency,
    )


def growth_stops_at(arch: ArchSpec) -> int | None:
    """Context after which a request's cache no longer grows (all layers windowed or fixed)."""
    if any(layer.kind in ("full", "mla") for layer in arch.layers):
        return None
    windows = [layer.window or 0 for layer in arch.layers if layer.kind == "sliding"]
    return max(windows) if windows else 0


def mla_vs_mha_ratio(d_c: int, d_rope: int, n_query_heads: int, d_k: int, d_v: int) -> float:
    """Per-token cache of an MLA layer over an MHA layer of the same dtype and heads.

    MLA caches one latent (d_c) plus one rope key (d_rope) for all heads; MHA caches K and V
    for every query head.
    """
    return (d_c + d_rope) / (n_query_heads * (d_k + d_v))
