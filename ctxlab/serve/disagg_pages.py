"""One page of KV on the wire: a logical block (`block_size` tokens) of every lane, K then V.

Both sides address a page through their own block table (`table[lane, page]`), so the
physical block ids never cross the wire; only the pool's `read_rows` / `write_rows` touch
the storage. `layout_key` is what the two processes must agree on before any page moves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ctxlab.errors import CtxlabError
from ctxlab.kv.layout import KVLayout
from ctxlab.kv.pool import KVPool

if TYPE_CHECKING:
    from ctxlab.engine import LLMEngine


def check_movable(engine: LLMEngine) -> None:
    """Both sides move the plain float cache page by page: refuse what they cannot move."""
    if engine.policy is not None or engine.kv.kv_format is not None:
        raise CtxlabError(
            "disaggregated serving moves the plain cache: give no --policy or --kv-format."
        )
    if engine.kv.layout.compute_dtype is not None:
        raise CtxlabError(
            "disaggregated serving moves the cache in the model's dtype: give no --kv-cache-dtype."
        )
    if engine.kv.sliding:
        raise CtxlabError(
            "disaggregated serving does not support models with sliding-window layers yet."
        )


def layout_key(layout: KVLayout, model_id: str) -> dict[str, object]:
    return {
        "model": model_id,
        "n_layers": layout.n_layers,
        "n_kv_heads": layout.n_kv_heads,
        "head_dim": layout.head_dim,
        "head_dim_v": layout.head_dim_v,
        "block_size": layout.block_size,
        "dtype": str(layout.dtype),
    }


def page_rows(table: torch.Tensor, page: int, block_size: int) -> torch.Tensor:
    """Flat pool rows `[n_lanes, block_size]` of logical block `page` of a sequence."""
    return table[:, page : page + 1] * block_size + torch.arange(block_size).view(1, -1)


def page_bytes(layout: KVLayout) -> int:
    """Bytes of one page on the wire (K and V of every lane)."""
    return layout.bytes_per_token * layout.block_size


def read_page(pool: KVPool, table: torch.Tensor, page: int) -> bytes:
    rows = page_rows(table, page, pool.layout.block_size)
    k, v = pool.read_rows(rows)
    return _raw(k) + _raw(v)


def write_page(pool: KVPool, table: torch.Tensor, page: int, payload: bytearray) -> None:
    """Store one received page; the payload's size was checked by the caller."""
    lay = pool.layout
    rows = page_rows(table, page, lay.block_size)
    flat = torch.frombuffer(payload, dtype=lay.dtype)
    nk = lay.n_lanes * lay.block_size * lay.head_dim
    k = flat[:nk].view(lay.n_lanes, lay.block_size, lay.head_dim)
    v = flat[nk:].view(lay.n_lanes, lay.block_size, lay.head_dim_v)
    pool.write_rows(rows, k, v)


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()
