"""A decoder layer's decode-sized work in compiled calls (`decode_block.c`), built once per
machine by `ctxlab.native`.

Why: at a 4-sequence decode step of SmolLM2 the layers' own Python (two norms, four linear
calls, RoPE, SwiGLU, two residual adds and the views between them, about a dozen calls a
layer) took 2.7 of a 23-ms int8 step with every kernel replaced by a no-op
(`benchmarks/decode_floor.py`). Here a layer is one call before its attention and one after
(`pre`, `post`), or, where the engine describes the step's attention
(`backend.CompiledDecodeBackend`), one call for all of it (`step`), running the same kernels
in the same order through the addresses their libraries export, so the hidden states are bit
for bit the Python path's.

It applies where every piece has its compiled kernel: float32 activations of 1 to
`gemv.MAX_ROWS` rows, linears that offer a `gemv.FixedCall` (fp32 and bf16 weights, int8 on
AMX tiles), no per-head q/k norms, the norm and elementwise kernels built. Anything else
runs the layer's Python path, unchanged.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from ctxlab import native
from ctxlab.model import elementwise, gemv, norm_kernel

SOURCE = Path(__file__).with_name("decode_block.c")
_NEVER = "never"  # kept on a layer whose linears' formats have no fixed calls
_VP, _L = ctypes.c_void_p, ctypes.c_long


class _Linear(ctypes.Structure):
    _fields_ = [
        ("kind", _L), ("fn", _VP), ("k", _L), ("n", _L), ("w", _VP), ("scale", _VP),
        ("bias", _VP), ("rot", _VP), ("block", _L),
    ]  # fmt: skip


class _Block(ctypes.Structure):
    _fields_ = [
        ("norm", _VP), ("rope", _VP), ("silu", _VP), ("norm1", _VP), ("norm2", _VP),
        ("eps", ctypes.c_float), ("hidden", _L), ("qk_heads", _L), ("head_dim", _L),
        ("inter", _L), ("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear),
        ("down", _Linear),
    ]  # fmt: skip


class Attn(ctypes.Structure):
    """One layer's attention at a pure decode step, for `block_step` (the engine fills it:
    `ctxlab.engine.compiled_decode`): the pool's row write and decode attention functions
    with their fixed arguments, then this step's rows, block tables and lengths."""

    _fields_ = [
        ("write", _VP), ("k_rows", _VP), ("v_rows", _VP), ("slots", _L), ("width", _L),
        ("elem", _L), ("decode", _VP), ("k_pool", _VP), ("v_pool", _VP),
        ("scale", ctypes.c_float), ("kv_heads", _L), ("group", _L), ("dv", _L), ("bs", _L),
        ("kw", _L), ("vw", _L), ("seqs", _L), ("rows", _VP), ("table", _VP), ("lens", _VP),
        ("mask", _VP), ("mask_len", _L), ("nb", _L),
    ]  # fmt: skip


def _declare(lib: ctypes.CDLL) -> None:
    lib.block_pre.argtypes = [_VP, _VP, _L, _VP, _VP, _VP]  # block, x, rows, cos, sin, qkv
    lib.block_pre.restype = ctypes.c_int
    lib.block_post.argtypes = [_VP, _VP, _VP, _L, _VP]  # block, attn, x, rows, out
    lib.block_post.restype = ctypes.c_int
    # block, attention, x, rows, cos, sin, out
    lib.block_step.argtypes = [_VP, _VP, _VP, _L, _VP, _VP, _VP]
    lib.block_step.restype = ctypes.c_int


@functools.cache
def kernel() -> ctypes.CDLL | None:
    return native.load(SOURCE, _declare)


class FixedLinear(Protocol):
    def fixed_call(self) -> gemv.FixedCall | None: ...


class Norm(Protocol):
    weight: torch.Tensor
    eps: float


def _linear(call: gemv.FixedCall) -> _Linear:
    s = call.spec
    return _Linear(int(s.shape), s.fn, s.k, s.n, s.weights, s.scale, s.bias, s.rotation, s.block)


class DecodeBlock:
    """One layer's compiled decode path: `pre` (norm, q|k|v, RoPE), then the engine's
    attention, then `post` (output projection and residual, norm, SwiGLU MLP, residual); or
    `step`, all three with the cache write, where the engine described the attention."""

    def __init__(
        self,
        key: tuple[object, ...],
        calls: tuple[gemv.FixedCall, ...],
        norms: tuple[torch.Tensor, torch.Tensor],
        eps: float,
        qk_heads: int,
        head_dim: int,
        lib: ctypes.CDLL,
    ) -> None:
        qkv, o, gate_up, down = calls
        self.key = key
        self._keep = (calls, norms)  # what the struct's addresses point into
        self._hidden, self._qkv_n, self._attn_n = qkv.spec.k, qkv.spec.n, o.spec.k
        self._rope_n = head_dim  # cos/sin values per row
        self._block = _Block(
            native.address(norm_kernel.kernel().rms_norm_f32),  # type: ignore[union-attr]
            native.address(elementwise.kernel().rope_f32),  # type: ignore[union-attr]
            native.address(elementwise.kernel().silu_mul_f32),  # type: ignore[union-attr]
            norms[0].data_ptr(), norms[1].data_ptr(), eps, qkv.spec.k, qk_heads, head_dim,
            down.spec.k, _linear(qkv), _linear(o), _linear(gate_up), _linear(down),
        )  # fmt: skip
        self._at = ctypes.addressof(self._block)
        self._pre, self._post, self._step = lib.block_pre, lib.block_post, lib.block_step

    def pre(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
        """`[rows, q|k|v]` of `x [rows, hidden]`, q and k rotated; None where this path does
        not take the inputs (the caller runs the layer's Python path)."""
        if not self._takes(x, cos, sin):
            return None
        rows = x.shape[0]
        qkv = torch.empty(rows, self._qkv_n)
        status = self._pre(self._at, x.data_ptr(), rows, cos.data_ptr(), sin.data_ptr(),
                           qkv.data_ptr())  # fmt: skip
        if status:
            raise MemoryError("the compiled decode block could not allocate its scratch rows")
        return qkv

    def _takes(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
        rows = x.shape[0]
        return (
            _plain_rows(x, self._hidden)
            and cos.dtype is torch.float32
            and sin.dtype is torch.float32
            and cos.is_contiguous()
            and sin.is_contiguous()
            and cos.numel() == sin.numel() == rows * self._rope_n
        )

    def step(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: int
    ) -> torch.Tensor | None:
        """The layer's output at a pure decode step whose attention the backend described
        at address `attn` (`Attn`): one call, the cache write included. None (nothing
        written) where this path does not take the inputs."""
        if not self._takes(x, cos, sin):
            return None
        rows = x.shape[0]
        out = torch.empty(rows, self._hidden)
        status = self._step(self._at, attn, x.data_ptr(), rows, cos.data_ptr(), sin.data_ptr(),
                            out.data_ptr())  # fmt: skip
        if status == -3:  # a description of another batch: nothing written
            return None
        if status == -1:
            raise IndexError("a pool row of this decode step is outside the pool")
        if status == -2:
            raise MemoryError("the compiled decode block could not allocate its scratch rows")
        if status:
            raise RuntimeError("the decode attention refused shapes the engine planned for it")
        return out

    def post(self, attn: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
        """The layer's output for attention output `attn [rows, heads * dv]` and its input
        `x`; None where this path does not take them."""
        rows = x.shape[0]
        if attn.shape[0] != rows or not _plain_rows(attn, self._attn_n):
            return None
        out = torch.empty(rows, self._hidden)
        status = self._post(self._at, attn.data_ptr(), x.data_ptr(), rows, out.data_ptr())
        if status:
            raise MemoryError("the compiled decode block could not allocate its scratch rows")
        return out


def _plain_rows(x: torch.Tensor, width: int) -> bool:
    """`gemv.decode_rows` that autograd does not track."""
    return gemv.decode_rows(x, width) and not (torch.is_grad_enabled() and x.requires_grad)


def for_layer(
    owner: nn.Module,
    norms: tuple[Norm, Norm],
    linears: tuple[nn.Module, nn.Module, nn.Module, nn.Module],
    qk_heads: int,
    head_dim: int,
) -> DecodeBlock | None:
    """The compiled decode path of a layer with these norms (before attention, before the
    MLP) and these linears (q|k|v, output, gate|up, down); kept on `owner` with the
    addresses it holds and made again when one changes; None where it does not apply."""
    cached = owner.__dict__.get("_decode_block")
    if cached is _NEVER:
        return None
    lib = kernel()
    if lib is None or norm_kernel.kernel() is None or elementwise.kernel() is None:
        return None
    if not all(hasattr(m, "fixed_call") for m in linears):  # a format without one: never
        owner.__dict__["_decode_block"] = _NEVER
        return None
    calls = tuple(_fixed_call(m) for m in linears)
    w1, w2 = norms[0].weight, norms[1].weight
    key = (*calls, w1.data_ptr(), w2.data_ptr())
    if isinstance(cached, tuple) and cached[0] == key:  # calls compare by identity
        return cached[1]
    block = _build(calls, norms, qk_heads, head_dim, key, lib)
    owner.__dict__["_decode_block"] = (key, block)
    return block


def _fixed_call(module: nn.Module) -> gemv.FixedCall | None:
    """The module's decode-sized call (its format offers `fixed_call`, checked before)."""
    offers: FixedLinear = module  # type: ignore[assignment]
    return offers.fixed_call()


def _build(
    calls: tuple[gemv.FixedCall | None, ...],
    norms: tuple[Norm, Norm],
    qk_heads: int,
    head_dim: int,
    key: tuple[object, ...],
    lib: ctypes.CDLL,
) -> DecodeBlock | None:
    qkv, o, gate_up, down = calls
    if qkv is None or o is None or gate_up is None or down is None:
        return None
    w1, w2 = norms[0].weight.detach(), norms[1].weight.detach()
    if norms[0].eps != norms[1].eps or not all(
        w.dtype == torch.float32 and w.is_contiguous() and w.is_cpu for w in (w1, w2)
    ):
        return None
    hidden, inter = qkv.spec.k, down.spec.k
    if not (
        o.spec.n == hidden == gate_up.spec.k == down.spec.n
        and gate_up.spec.n == 2 * inter
        and qkv.spec.n > qk_heads * head_dim
        and w1.numel() == w2.numel() == hidden
    ):
        return None
    calls4 = (qkv, o, gate_up, down)
    return DecodeBlock(key, calls4, (w1, w2), norms[0].eps, qk_heads, head_dim, lib)
