"""The paged decode attention's C loops (`paged_decode.c`), called through ctypes.

Same inputs and arithmetic as the numba loops (`numba_decode.py`); the library is built once
per machine by `ctxlab.native` (None without a C compiler or with `CTXLAB_NATIVE=off`). A call
returns False when its shapes are outside what the C loops take (head sizes not a multiple
of 16, more than 16 query heads per KV head, heads wider than 512): the caller then runs the
numba loop on the same arrays.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ctxlab import native

if TYPE_CHECKING:
    from ctxlab.kv.store import KVStore

SOURCE = Path(__file__).with_name("paged_decode.c")
_VP, _L, _I, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
# table, lens, mask, use_mask, mask_len, scale, out, B, H, g, d, dv, bs, nb, kw, vw
_TAIL = [_VP, _VP, _VP, _I, _L, _F, _VP, *[_L] * 9]
_STORAGE = {"f32": 2, "bf16": 2, "int8": 4}  # pointers a pool format passes after q


def _declare(lib: ctypes.CDLL) -> None:
    for kind, n in _STORAGE.items():
        fn = getattr(lib, f"decode_{kind}")
        fn.argtypes = [_VP] * (1 + n) + _TAIL
        fn.restype = _I


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled loops for this CPU, or None (logged once by `ctxlab.native`)."""
    return native.load(SOURCE, _declare)


# Per pool: the storage's pointers and row widths, taken once (the pool's tensors live as
# long as the pool).
_pointers: weakref.WeakKeyDictionary[KVStore, tuple[tuple[int, ...], int, int]] = (
    weakref.WeakKeyDictionary()
)


def _pool_pointers(pool: KVStore, storage: tuple) -> tuple[tuple[int, ...], int, int]:
    try:
        return _pointers[pool]
    except (KeyError, TypeError):
        pass
    ptrs = tuple(int(a.ctypes.data) for a in storage)
    kw = storage[0].shape[-1]
    vw = storage[-2].shape[-1] if len(storage) == 4 else storage[1].shape[-1]
    entry = (ptrs, kw, vw)
    with contextlib.suppress(TypeError):  # not weakly referenceable: recomputed each call
        _pointers[pool] = entry
    return entry


def target(kind: str, pool: KVStore, storage: tuple) -> tuple[int, tuple[int, ...], int, int]:
    """The loop for pool format `kind` as an address, with the storage's addresses and row
    widths (what `run` passes), for compiled callers (`decode_block.c`)."""
    lib = library()
    assert lib is not None, "c_decode.target needs library()"
    ptrs, kw, vw = _pool_pointers(pool, storage)
    fn = getattr(lib, f"decode_{kind}")
    return native.address(fn), ptrs, kw, vw


def unsupported(g: int, d: int, dv: int) -> bool:
    """Shapes the C loops refuse (they return -1): `paged_decode.c`'s own test."""
    return bool(not 1 <= g <= 16 or d % 16 or dv % 16 or not 16 <= d <= 512 or not 16 <= dv <= 512)


def run(
    kind: str,
    pool: KVStore,
    storage: tuple,
    q: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    out: torch.Tensor,
) -> bool:
    """Decode attention into `out [B, H, g, dv]` (float32) over the pool in place: q `[B, H, g,
    d]` float32, `table [B, H, nb]` and `lens [B, H]` int64, mask `[B, H, Lm]` bool or None,
    all contiguous. False (nothing written) when the C loops do not take these shapes."""
    lib = library()
    assert lib is not None, "c_decode.run needs library()"
    ptrs, kw, vw = _pool_pointers(pool, storage)
    B, H, g, d = q.shape
    mask_ptr, mask_len = (None, 0) if mask is None else (mask.data_ptr(), mask.shape[-1])
    status = getattr(lib, f"decode_{kind}")(
        q.data_ptr(), *ptrs, table.data_ptr(), lens.data_ptr(), mask_ptr, mask is not None,
        mask_len, scale, out.data_ptr(), B, H, g, d, out.shape[-1],
        storage[0].shape[1], table.shape[-1], kw, vw,
    )  # fmt: skip
    if status == -2:
        raise MemoryError("the C decode attention could not allocate its lane buffers")
    return status == 0
