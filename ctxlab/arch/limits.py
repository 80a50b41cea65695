"""Sizes no real model comes near, and the head-count rules every attention layer obeys.

Readers (config.json, GGUF), the planner and the lab refuse a value past these limits with
one sentence ("absurdly large") before any per-layer work, so a typo such as a billion
layers is an error in a millisecond instead of a hang. The limits sit orders of magnitude
above the largest published models (126 layers, 128 heads, a 10M-token context), so no real
architecture is refused. Nothing here imports torch.
"""

from __future__ import annotations

from ctxlab.errors import CtxlabError

MAX_TOKENS = 1 << 30  # a billion-token context is already far past any model
MAX_LAYERS = 10_000
MAX_HEADS = 4_096
MAX_DIM = 65_536  # a head, latent or state width
MAX_WIDTH = 1 << 20  # hidden, MLP and expert widths
MAX_COUNT = 1 << 30  # anything else that counts (experts, vocabulary entries, ...)


def check_limit(value: int, limit: int, what: str, unit: str = "") -> int:
    """`value` itself, or one sentence when it is past `limit`."""
    if value > limit:
        suffix = f" {unit}" if unit else ""
        raise CtxlabError(
            f"{what} of {value:,}{suffix} is absurdly large; ctxlab accepts up to {limit:,}."
        )
    return value


def check_heads(query_heads: int, kv_heads: int, where: str) -> None:
    """Grouped-query attention: each KV head serves a whole group of query heads.

    So KV heads can be at most the query heads and must divide them; anything else is a
    config that no attention kernel runs.
    """
    if kv_heads > query_heads:
        raise CtxlabError(
            f"{where}: {kv_heads} KV heads for {query_heads} query heads; a model has at most "
            "as many KV heads as query heads."
        )
    if query_heads % kv_heads:
        raise CtxlabError(
            f"{where}: {query_heads} query heads are not a multiple of {kv_heads} KV heads; "
            "each KV head must serve a whole group of query heads."
        )
