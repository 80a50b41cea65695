"""ctxlab's compiled linear kernels (`gemv.c`): a loop for decode rows, AMX tiles for all rows.

A decode step multiplies a few rows by every weight once, so its time is the weights' bytes
over the memory bandwidth. torch's kernels are tuned for larger products: at 1 to 4 rows
oneDNN's prepacked bf16 kernel reads the weights at 8-9 GB/s on one core of the AMX machine,
the compiled loop and the tiles at 11-12 (what a plain read of the same bytes reaches),
`benchmarks/weight_formats.py --only kernels` (docs/decode.md).

- `small_linear` / `linear` / `Linear`: 1 to `MAX_ROWS` rows of float32, bf16 or int8
  weights as they are; larger calls stay on torch's kernels.
- `amx_linear` / `amx_int8_linear`: bf16 weights or int8 codes packed once into AMX tiles
  (`amx_pack`), any row count (also prefill: 1.1-1.3x oneDNN's bf16, 3.3x fbgemm's int8).

The library is built once per machine (`ctxlab.native`); where it cannot be, `kernels()` is
None and every layer runs its torch path."""

from __future__ import annotations

import ctypes
import enum
import functools
import itertools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ctxlab import native

MAX_ROWS = 8  # the loop keeps all rows' sums in registers; more rows and torch's kernels win
SOURCE = Path(__file__).with_name("gemv.c")

_VP, _L = ctypes.c_void_p, ctypes.c_long
_SIGNATURE = [_VP, _L, _L, _VP, _L, _VP, _VP]  # x, M, K, W, N, bias (or None), y


def _declare(lib: ctypes.CDLL) -> None:
    for name in ("gemv_f32", "gemv_bf16", "gemv_i8"):
        fn = getattr(lib, name)
        fn.argtypes = _SIGNATURE
        fn.restype = None
    lib.bf16_amx.argtypes = [_VP, _L, _L, _VP, _L, _L, _VP, _VP]  # x, M, K, W, N, ldy, b, y
    lib.bf16_amx.restype = None
    for name in ("gemv_bf16_dot_products", "bf16_amx_ready", "int8_amx_available"):
        getattr(lib, name).argtypes = []
        getattr(lib, name).restype = ctypes.c_int
    for name in ("bf16_amx_pack", "bf16_amx_unpack", "int8_amx_pack", "int8_amx_unpack"):
        getattr(lib, name).argtypes = [_VP, _L, _L, _VP]
        getattr(lib, name).restype = None
    # x, M, K, W, scales, N, ldy, bias, y, rotation (or None), its block
    lib.int8_amx.argtypes = [_VP, _L, _L, _VP, _VP, _L, _L, _VP, _VP, _VP, _L]
    lib.int8_amx.restype = None


@functools.cache
def kernels() -> ctypes.CDLL | None:
    """The compiled library for this CPU, or None (no compiler, `CTXLAB_NATIVE=off`, a failed
    build: logged once by `ctxlab.native`)."""
    return native.load(SOURCE, _declare)


def bf16_dot_products() -> bool:
    """Whether the bf16 loop uses the CPU's bf16 dot-product instruction (AVX512-BF16) rather
    than widening each weight to float32 (same arithmetic, more instructions)."""
    lib = kernels()
    return lib is not None and bool(lib.gemv_bf16_dot_products())


@functools.cache
def amx() -> bool:
    """Whether bf16 products run on AMX tiles here: a CPU with them, a library built for
    them, and the kernel's permission for the tile state (asked once per process)."""
    lib = kernels()
    return lib is not None and bool(lib.bf16_amx_ready())


@functools.cache
def amx_int8() -> bool:
    """Whether int8 products run on AMX tiles here (`amx()` and a library built for them)."""
    lib = kernels()
    return amx() and lib is not None and bool(lib.int8_amx_available())


def amx_fits(weight: torch.Tensor) -> bool:
    """Whether a weight `[N, K]` takes the AMX layout of its dtype: N a multiple of 64, K of
    32 (bf16: 32 values a tile row) or of 64 (int8)."""
    n, k = weight.shape
    return n % 64 == 0 and k % (64 if weight.dtype == torch.int8 else 32) == 0


def amx_pack(weight: torch.Tensor) -> torch.Tensor:
    """bf16 weights (or int8 codes) `[N, K]` in the tiles' layout: the same bytes, reordered
    (`amx()`, or `amx_int8()` for codes, and `amx_fits(weight)` are true)."""
    lib = kernels()
    assert lib is not None
    codes = weight.dtype == torch.int8
    dense = weight.detach().contiguous() if codes else weight.detach().to(torch.bfloat16)
    dense = dense.contiguous()
    out = torch.empty_like(dense)
    pack = lib.int8_amx_pack if codes else lib.bf16_amx_pack
    pack(dense.data_ptr(), dense.shape[0], dense.shape[1], out.data_ptr())
    return out


def amx_unpack(tiles: torch.Tensor) -> torch.Tensor:
    """The `[N, K]` weights (or codes) back out of `amx_pack`'s layout."""
    lib = kernels()
    assert lib is not None
    out = torch.empty_like(tiles)
    unpack = lib.int8_amx_unpack if tiles.dtype == torch.int8 else lib.bf16_amx_unpack
    unpack(tiles.data_ptr(), tiles.shape[0], tiles.shape[1], out.data_ptr())
    return out


def amx_linear(
    x: torch.Tensor, tiles: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`x [..., K] @ W.T (+ bias)` in float32 for any number of rows, W in `amx_pack`'s
    layout: x rounded to bf16, exact products, float32 sums (oneDNN's bf16 arithmetic)."""
    lib = kernels()
    assert lib is not None
    return _tiles_call(lib.bf16_amx, x, tiles, None, bias)


def amx_int8_linear(
    x: torch.Tensor,
    tiles: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    hadamard_signs: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x [..., K]` times int8 codes in `amx_pack`'s layout with one float32 `scale` per
    output row: each row of x quantized to int8 at its own scale (max |x| / 127, rounded to
    nearest even), exact int32 sums, rescaled to float32 (+ bias). `hadamard_signs` (B
    float32 values, B 16, 32 or 64 dividing K): each row is first multiplied by
    blockdiag(`rotation.signed_hadamard` with these signs) inside the kernel, by a fast
    Walsh-Hadamard transform: the int formats' online rotation without a pass over memory."""
    lib = kernels()
    assert lib is not None and scale.dtype == torch.float32 and scale.is_contiguous()
    tail: tuple[int | None, int] = (None, 0)
    if hadamard_signs is not None:
        b = hadamard_signs.shape[0]
        assert b in (16, 32, 64) and x.shape[-1] % b == 0
        assert hadamard_signs.dtype == torch.float32 and hadamard_signs.is_contiguous()
        tail = (hadamard_signs.data_ptr(), b)
    return _tiles_call(lib.int8_amx, x, tiles, scale, bias, tail)


_POOL: ThreadPoolExecutor | None = None


def _operands(
    x: torch.Tensor, n: int, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """What every kernel call takes: x as float32 rows `[M, K]` (contiguous), an empty
    float32 output `[M, n]`, and the bias as contiguous float32 (or None)."""
    flat = x.reshape(-1, x.shape[-1])
    flat = flat if flat.dtype == torch.float32 else flat.float()
    flat = flat if flat.is_contiguous() else flat.contiguous()
    b = None if bias is None else bias.float().contiguous()
    return flat, torch.empty(flat.shape[0], n, dtype=torch.float32), b


def _row_slices(rows: int) -> list[tuple[int, int]]:
    """How a tiles call's rows are split between torch's threads: one slice at decode sizes
    (a decode step runs on one thread, `engine/phase_threads.py`), else up to
    `torch.get_num_threads()` slices of whole 16-row tiles, at least 128 rows each (prefill
    uses every thread). Each thread prepares only its own rows and reads every weight (the
    second reader finds them in the shared cache). On the AMX machine, 2 threads: 1.7x one
    thread at 512 rows (1.1-1.4x oneDNN's prepacked bf16 on 2 threads); at 128 rows a split
    did not pay for handing work to a thread (0.65 against 0.65 ms on a 3072 x 576 layer,
    where oneDNN on 2 threads takes 0.43)."""
    parts = min(torch.get_num_threads(), rows // 128) if rows > MAX_ROWS else 1
    if parts <= 1:
        return [(0, rows)]
    tiles = -(-rows // 16)
    edges = [min(rows, tiles * i // parts * 16) for i in range(parts)] + [rows]
    return list(itertools.pairwise(edges))


def _tiles_call(
    fn: Callable[..., None],
    x: torch.Tensor,
    tiles: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    tail: tuple[int | None, int] | tuple[()] = (),
) -> torch.Tensor:
    """Run a tiles kernel `fn(x, M, K, W, [scales,] N, ldy, bias, y, *tail)` over slices of
    rows, on torch's threads (the kernel releases the GIL: ctypes calls a C function without
    it)."""
    global _POOL
    flat, y, b = _operands(x, tiles.shape[0], bias)
    (rows, k), n = flat.shape, y.shape[1]
    if not rows:
        return y.reshape(*x.shape[:-1], n)
    extra = () if scale is None else (scale.data_ptr(),)

    def part(lo: int, hi: int) -> None:
        fn(
            flat.data_ptr() + 4 * lo * k, hi - lo, k, tiles.data_ptr(), *extra, n, n,
            None if b is None else b.data_ptr(), y.data_ptr() + 4 * lo * n, *tail,
        )  # fmt: skip

    slices = _row_slices(rows)
    if len(slices) == 1:
        part(0, rows)
    else:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
        futures = [_POOL.submit(part, lo, hi) for lo, hi in slices[1:]]
        part(*slices[0])
        for f in futures:
            f.result()
    return y.reshape(*x.shape[:-1], n)


class CallShape(enum.IntEnum):
    """Which of the kernels' three argument lists a `FixedCall` makes (`decode_block.c` reads
    the same numbers)."""

    LOOP = 0  # gemv_f32 / gemv_bf16 / gemv_i8: x, M, K, W, N, bias, y
    BF16_TILES = 1  # bf16_amx: x, M, K, W, N, ldy, bias, y
    INT8_TILES = 2  # int8_amx: x, M, K, W, scales, N, ldy, bias, y, rotation, its block


@dataclass(frozen=True)
class CallSpec:
    """Everything a linear kernel call takes besides its rows: the function and the
    addresses of the weights, their row scales, the bias and the rotation signs (0: none)."""

    shape: CallShape
    fn: int
    k: int
    n: int
    weights: int
    scale: int = 0
    bias: int = 0
    rotation: int = 0
    block: int = 0


class FixedCall:
    """One linear layer's kernel call for decode-sized inputs, with everything but the input
    and output taken once (`spec`). A decode step makes about 120 linear calls; through the
    general path each spends about 9 us of Python (shape and dtype checks, a closure, the
    row split, ctypes converting 11 arguments), through this one about 3.

    `key` says which tensors' addresses it holds (`address_key`); the module that made it
    rebuilds it when its tensors' key changes (a storage replaced, `t.data = ...` included).
    """

    __slots__ = ("_args", "_fn", "_keep", "_tail", "key", "spec")

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        # addresses mean nothing in a copy or a pickle: copies carry None, rebuilt on use
        return _dropped, ()

    def __init__(
        self,
        key: tuple[int, ...],
        keep: tuple[torch.Tensor | None, ...],
        fn: Callable[..., None],
        spec: CallSpec,
    ) -> None:
        self.key, self.spec = key, spec
        self._keep = keep  # the tensors whose addresses `spec` holds, kept alive
        self._fn = fn
        bias = spec.bias or None
        if spec.shape == CallShape.LOOP:
            self._args, self._tail = (spec.weights, spec.n, bias), ()
        elif spec.shape == CallShape.BF16_TILES:
            self._args, self._tail = (spec.weights, spec.n, spec.n, bias), ()
        else:
            self._args = (spec.weights, spec.scale, spec.n, spec.n, bias)
            self._tail = (spec.rotation or None, spec.block)

    @property
    def out_features(self) -> int:
        return self.spec.n

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        """`x [rows, K] @ W.T (+ bias)` in float32 for a contiguous float32 `x` of 1 to
        `MAX_ROWS` rows on the CPU; None for any other x (the caller takes its general path)."""
        spec = self.spec
        if not decode_rows(x, spec.k):
            return None
        rows = x.shape[0]
        y = torch.empty(rows, spec.n)
        self._fn(x.data_ptr(), rows, spec.k, *self._args, y.data_ptr(), *self._tail)
        return y


def decode_rows(x: torch.Tensor, width: int) -> bool:
    """Whether `x` is contiguous float32 rows `[1..MAX_ROWS, width]` on the CPU: what a
    `FixedCall` (and the compiled decode block) takes."""
    return (
        x.dtype is torch.float32
        and x.dim() == 2
        and 0 < x.shape[0] <= MAX_ROWS
        and x.shape[1] == width
        and x.is_contiguous()
        and x.device.type == "cpu"
    )


def _dropped() -> None:
    return None


def address_key(*tensors: torch.Tensor | None) -> tuple[int, ...]:
    """The addresses a `FixedCall` built from these tensors holds (0 for None)."""
    return tuple(0 if t is None else t.data_ptr() for t in tensors)


def cached_call(
    module: nn.Module, make: Callable[..., FixedCall], *tensors: torch.Tensor | None
) -> FixedCall:
    """`make(*tensors)`, kept on `module` and made again only when the tensors' addresses
    change (`FixedCall.key`)."""
    call = module.__dict__.get("_fixed_call")
    if call is None or call.key != address_key(*tensors):
        call = make(*tensors)
        module.__dict__["_fixed_call"] = call
    return call


def _float_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.detach().float().contiguous()


def amx_call(tiles: torch.Tensor, bias: torch.Tensor | None = None) -> FixedCall:
    """`amx_linear(x, tiles, bias)` as a `FixedCall`."""
    lib = kernels()
    assert lib is not None
    b = _float_bias(bias)
    n, k = tiles.shape
    fn = lib.bf16_amx
    spec = CallSpec(
        CallShape.BF16_TILES, native.address(fn), k, n, tiles.data_ptr(), bias=address_key(b)[0]
    )
    return FixedCall(address_key(tiles, bias), (tiles, b), fn, spec)


def amx_int8_call(
    tiles: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    hadamard_signs: torch.Tensor | None = None,
) -> FixedCall:
    """`amx_int8_linear(x, tiles, scale, bias, hadamard_signs)` as a `FixedCall`."""
    lib = kernels()
    assert lib is not None and scale.dtype == torch.float32 and scale.is_contiguous()
    b = _float_bias(bias)
    n, k = tiles.shape
    block = 0
    if hadamard_signs is not None:
        assert hadamard_signs.dtype == torch.float32 and hadamard_signs.is_contiguous()
        block = hadamard_signs.shape[0]
        assert block in (16, 32, 64) and k % block == 0
    fn = lib.int8_amx
    spec = CallSpec(
        CallShape.INT8_TILES, native.address(fn), k, n, tiles.data_ptr(), scale.data_ptr(),
        address_key(b)[0], address_key(hadamard_signs)[0], block,
    )  # fmt: skip
    key = address_key(tiles, scale, bias, hadamard_signs)
    return FixedCall(key, (tiles, scale, b, hadamard_signs), fn, spec)


def loop_call(weight: torch.Tensor, bias: torch.Tensor | None = None) -> FixedCall:
    """`small_linear(x, weight, bias)` as a `FixedCall` (the caller checked `serves`)."""
    lib = kernels()
    assert lib is not None and weight.is_contiguous()
    b = _float_bias(bias)
    n, k = weight.shape
    fn = getattr(lib, _FUNCTION[weight.dtype])
    spec = CallSpec(
        CallShape.LOOP, native.address(fn), k, n, weight.data_ptr(), bias=address_key(b)[0]
    )
    return FixedCall(address_key(weight, bias), (weight, b), fn, spec)


_FUNCTION = {torch.float32: "gemv_f32", torch.bfloat16: "gemv_bf16", torch.int8: "gemv_i8"}


def serves(weight: torch.Tensor) -> bool:
    """Whether decode-sized calls on this weight can run the compiled loop."""
    return (
        weight.device.type == "cpu"
        and weight.dim() == 2
        and weight.dtype in _FUNCTION
        and weight.is_contiguous()
        and kernels() is not None
    )


def small_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`x [..., K] @ weight[N, K].T (+ bias)` in float32 for at most `MAX_ROWS` rows of x, by
    the compiled loop (the caller checked `serves(weight)`). bf16 weights: x is rounded to
    bf16 first, as torch's bf16 linear does; int8 weights: the raw codes' products (the
    caller applies its row scales)."""
    lib = kernels()
    assert lib is not None, "small_linear needs the compiled library"
    flat, y, b = _operands(x, weight.shape[0], bias)
    (rows, k), n = flat.shape, y.shape[1]
    assert weight.shape[1] == k and rows <= MAX_ROWS
    if rows:
        getattr(lib, _FUNCTION[weight.dtype])(
            flat.data_ptr(), rows, k, weight.data_ptr(), n,
            None if b is None else b.data_ptr(), y.data_ptr(),
        )  # fmt: skip
    return y.reshape(*x.shape[:-1], n)


def decode_sized(x: torch.Tensor) -> bool:
    """Whether a call of `x [..., K]` has at most `MAX_ROWS` rows (the compiled loop's)."""
    return x.numel() <= MAX_ROWS * x.shape[-1]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`, with decode-sized float32 calls (up to `MAX_ROWS` rows, on the CPU, no
    gradient wanted) through the compiled loop: the same float32 products summed in another
    order, about 1.6x faster than MKL's at 4 rows (docs/decode.md)."""
    if (
        x.dtype == torch.float32
        and weight.dtype == torch.float32
        and decode_sized(x)
        and x.device.type == "cpu"
        and not (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
        and serves(weight)
    ):
        return small_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """`nn.Linear` (float32 Parameters, the fp32 format and the parity reference) whose
    decode-sized calls run the compiled loop: through its `FixedCall` when no gradient is
    wanted, else through `linear`."""

    def fixed_call(self) -> FixedCall | None:
        """The decode-sized call of these weights (float32, the compiled loop built)."""
        w = self._parameters["weight"]
        if w is None or w.dtype != torch.float32 or not serves(w):
            return None
        return cached_call(self, loop_call, w, self._parameters["bias"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fixed = None if torch.is_grad_enabled() else self.fixed_call()
        y = None if fixed is None else fixed(x)  # decode-sized float32 rows
        return linear(x, self.weight, self.bias) if y is None else y
