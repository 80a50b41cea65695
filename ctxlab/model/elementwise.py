"""A decoder block's elementwise steps compiled (`elementwise.c`): SwiGLU's activation and
RoPE, one pass over float32 rows each, built once per machine by `ctxlab.native`.

Why: aten runs each as several kernels with temporaries (about 35 ms of a 4 x 128-token
prefill step on the AMX machine) and a decode step pays some 180 operator calls for them.
Each function returns None (or False) where its kernel does not apply: another dtype or
device, a layout it does not take, autograd, no library; the caller then runs aten's.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from ctxlab import native

SOURCE = Path(__file__).with_name("elementwise.c")


def _declare(lib: ctypes.CDLL) -> None:
    vp, n = ctypes.c_void_p, ctypes.c_long
    lib.silu_mul_f32.argtypes = [vp, n, n, n, vp]  # gate|up, rows, inter, row stride, out
    lib.silu_mul_f32.restype = None
    lib.rope_f32.argtypes = [vp, n, n, n, n, vp, vp]  # x, tokens, heads, dim, stride, cos, sin
    lib.rope_f32.restype = None


@functools.cache
def kernel() -> ctypes.CDLL | None:
    return native.load(SOURCE, _declare)


def _plain(t: torch.Tensor) -> bool:
    """A float32 CPU tensor autograd does not track."""
    return (
        t.dtype == torch.float32
        and t.device.type == "cpu"
        and not (torch.is_grad_enabled() and t.requires_grad)
    )


def silu_mul(gate_up: torch.Tensor, inter: int) -> torch.Tensor | None:
    """`silu(gate_up[:, :inter]) * gate_up[:, inter:]` for rows `[M, 2 * inter]` whose last
    dimension is contiguous, as a new `[M, inter]` tensor; None where the kernel does not
    apply."""
    lib = kernel()
    if (
        lib is None
        or not _plain(gate_up)
        or gate_up.dim() != 2
        or gate_up.shape[1] != 2 * inter
        or gate_up.stride(1) != 1
    ):
        return None
    rows = gate_up.shape[0]
    out = gate_up.new_empty(rows, inter)
    lib.silu_mul_f32(gate_up.data_ptr(), rows, inter, gate_up.stride(0), out.data_ptr())
    return out


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Rotate `x [T, heads, d]` in place (`layers.rope_tables`' cos and signed sin, `[T, 1,
    d]` or `[T, d]`, contiguous): x cos + rotate_half(x) sin. `x` may be the q|k heads of a
    wider row (its heads contiguous, rows strided). False, touching nothing, where the kernel
    does not apply."""
    lib = kernel()
    if lib is None or x.dim() != 3 or not all(_plain(t) for t in (x, cos, sin)):
        return False
    tokens, heads, dim = x.shape
    if (
        dim % 2
        or x.stride(2) != 1
        or x.stride(1) != dim
        or cos.numel() != tokens * dim
        or sin.numel() != tokens * dim
        or not (cos.is_contiguous() and sin.is_contiguous())
    ):
        return False
    lib.rope_f32(x.data_ptr(), tokens, heads, dim, x.stride(0), cos.data_ptr(), sin.data_ptr())
    return True
