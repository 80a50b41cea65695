"""ctxlab's compiled RMSNorm for float32 rows (`rms_norm.c`), built once per machine.

Why: aten's `F.rms_norm` is five kernels on CPU, a per-call cost paid 61 times a step by a
30-layer model and, at prefill sizes, five passes over the activations. Where the library
cannot be built (`ctxlab.native`), `rms_norm` returns None and the caller runs aten's.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from ctxlab import native

SOURCE = Path(__file__).with_name("rms_norm.c")


def _declare(lib: ctypes.CDLL) -> None:
    vp, n = ctypes.c_void_p, ctypes.c_long
    lib.rms_norm_f32.argtypes = [vp, n, n, vp, ctypes.c_float, vp]  # x, rows, dim, w, eps, y
    lib.rms_norm_f32.restype = None


@functools.cache
def kernel() -> ctypes.CDLL | None:
    return native.load(SOURCE, _declare)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """RMSNorm over the last dimension of contiguous float32 `x` on the CPU, or None where
    the compiled kernel does not apply (another dtype or device, a view, autograd, no
    library)."""
    lib = kernel()
    if (
        lib is None
        or x.dtype != torch.float32
        or x.device.type != "cpu"
        or not x.is_contiguous()
        or weight.dtype != torch.float32
        or not weight.is_contiguous()
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        return None
    dim = x.shape[-1]
    y = torch.empty_like(x)
    lib.rms_norm_f32(x.data_ptr(), x.numel() // dim, dim, weight.data_ptr(), eps, y.data_ptr())
    return y
