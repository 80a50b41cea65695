"""A prefill chunk's attention over its cached keys on AMX tiles (`chunk_attention.c`).

`PagedAttention._chunk` calls `attend` for a chunk that continues a cached sequence when the
prefill computes in bf16 and the pool stores float32 or bf16 rows: the kernel reads each KV
head's blocks from the pool once, straight into the tiles' layout, instead of gathering them,
converting them and calling SDPA (docs/decode.md, "A chunk's attention on tiles"). Where it
cannot run (no AMX, no compiler, a quantized pool, head sizes it does not take) `attend`
returns None and the caller keeps the SDPA path.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
from pathlib import Path

import torch

from ctxlab import native
from ctxlab.engine.kernels.paged_decode import float_rows
from ctxlab.kv.store import KVStore

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("chunk_attention.c")
_VP, _L, _I, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
# q, Hkv, R, d, dv, kpool, vpool, pool_bf16, kw, vw, table, nb, bs, L, bias, lo, hi, scale, out
_ARGS = [_VP, _L, _L, _L, _L, _VP, _VP, _I, _L, _L, _VP, _L, _L, _L, _VP, _VP, _VP, _F, _VP]


def _declare(lib: ctypes.CDLL) -> None:
    lib.chunk_attention_ready.restype = _I
    lib.chunk_attention.argtypes = _ARGS
    lib.chunk_attention.restype = _I


@functools.cache
def library() -> ctypes.CDLL | None:
    """The kernel for this CPU, or None: no compiler (logged by `ctxlab.native`), or a CPU
    without AMX bf16 tiles (logged here, once)."""
    lib = native.load(SOURCE, _declare)
    if lib is not None and not lib.chunk_attention_ready():
        log.info("chunk attention stays on SDPA: this CPU has no AMX bf16 tiles")
        return None
    return lib


def takes(pool: KVStore) -> bool:
    """Whether `attend` can run for this pool; where the kernel is built but refuses the
    pool, says why once (the chunks then run gather + SDPA)."""
    if library() is None:
        return False
    d, dv = pool.layout.head_dim, pool.layout.head_dim_v
    why = ""
    if d % 32 or dv % 64:
        why = f"head sizes {d} / {dv} (it takes multiples of 32 / 64)"
    elif float_rows(pool) is None:
        why = "the cache stores codes (int8, KIVI) or lives off the CPU"
    if why:
        _refused(why)
    return not why


@functools.cache
def _refused(why: str) -> None:
    log.info("chunk attention stays on SDPA: %s", why)


def attend(
    q: torch.Tensor,
    pool: KVStore,
    table: torch.Tensor,
    bias: torch.Tensor | None = None,
    span: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """Softmax(q k^T / sqrt(d) + mask) v for `q [Hkv, R, d]` bf16 over the keys of blocks
    `table [Hkv, nb]` (L = nb * block_size keys, as `pool.gather(table)` lays them out): the
    mask is `bias [..., Hkv, R, L]` (bf16, 0 or -inf), or `span` (lo, hi), each `[Hkv, R]`:
    row r sees keys lo..hi-1 alone. `[Hkv, R, dv]` bf16, or None where the kernel refuses
    (the caller runs SDPA)."""
    lib = library()
    views = float_rows(pool)
    if lib is None or views is None or q.dtype != torch.bfloat16:
        return None
    if (bias is None) == (span is None):
        raise ValueError("chunk attention takes one mask: a bias or a span")
    kind, (keys, values) = views[0], views[1][:2]
    hkv, rows, d = q.shape
    blocks = table.to(torch.int64).contiguous()
    length = blocks.shape[1] * pool.layout.block_size
    q = q.contiguous()
    lo = hi = None
    if bias is not None:
        bias = bias.reshape(hkv, rows, length).contiguous()
        assert bias.dtype == torch.bfloat16
    else:
        assert span is not None
        lo, hi = (x.to(torch.int32).reshape(hkv, rows).contiguous() for x in span)
    out = torch.empty(hkv, rows, pool.layout.head_dim_v, dtype=torch.bfloat16)
    done = lib.chunk_attention(
        q.data_ptr(), hkv, rows, d, out.shape[-1], keys.ctypes.data, values.ctypes.data,
        int(kind == "bf16"), keys.shape[-1], values.shape[-1], blocks.data_ptr(),
        blocks.shape[1], pool.layout.block_size, length,
        None if bias is None else bias.data_ptr(), None if lo is None else lo.data_ptr(),
        None if hi is None else hi.data_ptr(), 1.0 / math.sqrt(d), out.data_ptr(),
    )  # fmt: skip
    return out if done == 0 else None
