"""A step's new K/V rows written into a float32 or bfloat16 pool in one compiled call
(`row_write.c`), built once per machine by `ctxlab.native`.

Why: aten's reshapes, conversions and two `index_copy_` calls took 525 us a layer for a
512-token prefill of SmolLM2, five times this loop's 105 us (16 ms of a 216-ms bf16 prefill
step over 30 layers; at a 4-sequence decode step 10.8 against 6.3 us a layer).
`write_rows` returns False (nothing written) where it does not apply, and the pool then
writes through aten.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch

from ctxlab import native

SOURCE = Path(__file__).with_name("row_write.c")
_ELEM = {torch.float32: 4, torch.bfloat16: 2}


def _declare(lib: ctypes.CDLL) -> None:
    vp, n = ctypes.c_void_p, ctypes.c_long
    # k pool, v pool, slots, width, element bytes, rows, tokens, heads, k, k stride, v, v stride
    lib.write_rows.argtypes = [vp, vp, n, n, ctypes.c_int, vp, n, n, vp, n, vp, n]
    lib.write_rows.restype = ctypes.c_int


@functools.cache
def kernel() -> ctypes.CDLL | None:
    return native.load(SOURCE, _declare)


def _rows_of_heads(x: torch.Tensor, heads: int, width: int) -> bool:
    """`x [T, heads, width]` float32 on the CPU with each token's heads contiguous."""
    return (
        x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.dim() == 3
        and x.shape[1:] == (heads, width)
        and x.stride(2) == 1
        and x.stride(1) == width
    )


class RowWriter:
    """The kernel bound to one pool's K and V rows, checked once: a decode step writes every
    layer's rows, and the pool-side checks and pointers would otherwise be paid 30 times a
    step."""

    __slots__ = ("_fn", "_k_rows", "_pool_args", "_v_rows", "_width")

    def __init__(self, fn: Callable[..., int], k_rows: torch.Tensor, v_rows: torch.Tensor) -> None:
        slots, width = k_rows.shape
        self._fn, self._k_rows, self._v_rows, self._width = fn, k_rows, v_rows, width
        ptrs = (k_rows.data_ptr(), v_rows.data_ptr())
        self._pool_args = (*ptrs, slots, width, _ELEM[k_rows.dtype])

    def c_target(self) -> tuple[int, int, int, int, int, int]:
        """The kernel's address and its pool-side arguments (k rows, v rows, slots, width,
        element bytes), for compiled callers that write the rows themselves."""
        return (native.address(self._fn), *self._pool_args)

    def write(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        """k/v `[T, H, width]` at `rows [T, H]`; False (nothing written) where the kernel
        does not take these tensors. A slot out of range is an IndexError, nothing written."""
        heads = rows.shape[-1] if rows.dim() == 2 else 0
        width = self._width
        if (
            heads == 0
            or rows.dtype != torch.int64
            or not rows.is_contiguous()
            or rows.shape[0] != k.shape[0]
            or not _rows_of_heads(k, heads, width)
            or not _rows_of_heads(v, heads, width)
            or (torch.is_grad_enabled() and (k.requires_grad or v.requires_grad))
        ):
            return False
        status = self._fn(
            *self._pool_args, rows.data_ptr(), k.shape[0], heads, k.data_ptr(), k.stride(0),
            v.data_ptr(), v.stride(0),
        )  # fmt: skip
        if status != 0:
            raise IndexError(f"a pool row is outside the pool's {self._pool_args[2]} slots")
        return True


def writer(k_rows: torch.Tensor, v_rows: torch.Tensor) -> RowWriter | None:
    """A `RowWriter` for pool rows `k_rows`/`v_rows` `[slots, width]` (contiguous, float32
    or bfloat16, on the CPU, the same shape), or None where the kernel does not take them."""
    lib = kernel()
    if (
        lib is None
        or k_rows.dtype not in _ELEM
        or v_rows.dtype != k_rows.dtype
        or v_rows.shape != k_rows.shape
        or k_rows.device.type != "cpu"
        or not (k_rows.is_contiguous() and v_rows.is_contiguous())
    ):
        return None
    return RowWriter(lib.write_rows, k_rows, v_rows)


def write_rows(
    k_rows: torch.Tensor, v_rows: torch.Tensor, rows: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor,
) -> bool:  # fmt: skip
    """k/v `[T, H, width]` into `k_rows`/`v_rows` `[slots, width]` (contiguous, float32 or
    bfloat16) at `rows [T, H]`; False where the kernel does not take these tensors. A slot out
    of range is an IndexError, with nothing written."""
    bound = writer(k_rows, v_rows)
    return bound is not None and bound.write(rows, k, v)
