"""Linear layers (and the tied embedding) stored in a smaller format than float32.

A batch-1 decode step reads every weight once, so its time is the bytes of the weights over
the memory bandwidth: float32 weights move 4 bytes per parameter, int8 one, int4 half of one.
Each class keeps its weights in buffers, never as Parameters, so `next(model.parameters())`
still gives the model's activation dtype (the engine sizes its KV pool by it).

- `OneDNNLinear`: weights prepacked once for oneDNN: float32 (`fp32-onednn`: the bytes of
  fp32, a faster kernel at decode-sized calls) or bfloat16 (`bf16` on a CPU with bf16 dot
  products, AVX512-BF16 or AMX, where ctxlab's own kernels could not be built).
- `BF16Linear`: bfloat16 weights through ctxlab's compiled kernels (`gemv.py`: AMX tiles,
  or a loop for decode rows) where a C compiler built them, else `F.linear`.
- `Int8Linear`: int8 codes with one scale per output row, the input quantized per token
  and the int32 product rescaled to float: on AMX tiles through ctxlab's kernel where the
  CPU has them, else through fbgemm's dynamically quantized linear. One packed copy of the
  weights; no float copy is kept.
- `Int4Linear`: 4-bit codes with a scale and offset per 32 inputs of a row (the layout of
  GGUF's Q4_0/Q4_1, so their codes are taken as they are) through aten's
  `_weight_int4pack_mm_for_cpu`, with bfloat16 activations, scales and offsets. From
  `WIDE_ROWS` tokens a call (prefill chunks) runs a second, int8 copy of the same weights
  through fbgemm instead, because aten's int4 kernel is 3.8x slower than fbgemm's at 256
  tokens (1.6x at one).
- `GroupInt8Embedding`: token embedding rows as int8 codes with a scale per 32 values (GGUF
  Q8_0 exactly); a lookup dequantizes only the rows it reads.

Why these kernels: `benchmarks/weight_formats.py` measures them against float32 on this
machine; the results and the choice are in docs/decode.md.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ctxlab.errors import CtxlabError
from ctxlab.model import gemv
from ctxlab.model.gguf_blocks import GROUP, GroupCodes
from ctxlab.model.rotation import (
    ONLINE_BLOCK,
    block_for,
    hadamard,
    hadamard_signs,
    rotate_rows,
    signed_hadamard,
)


class PackedLinear(nn.Module):
    """What every weight format module shares: sizes, the bytes it holds, an optional bias."""

    fmt = "fp32"

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def weight_bytes(self) -> int:
        """Bytes of the stored weights (codes, scales, offsets, bias)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, format={self.fmt}"

    def _out(self, y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y if y.dtype == like.dtype else y.to(like.dtype)


class BF16Linear(PackedLinear):
    """bfloat16 weights `[out, in]`, through one of three kernels (`kernel`, chosen once):

    - "amx": the weights reordered into AMX tiles (`gemv.amx_pack`, same bytes), every call
      through ctxlab's tile loop (CPUs with AMX, a C compiler here);
    - "loop": the weights as they are; calls of up to `gemv.MAX_ROWS` rows (decode) through
      ctxlab's compiled loop, larger ones through aten's `F.linear`;
    - "aten": `F.linear` only (no C compiler, or asked for).

    All round the input to bf16, multiply exactly and sum in float32; only the order of the
    sums differs (aten also rounds its output to bf16)."""

    fmt = "bf16"
    KERNELS = ("amx", "loop", "aten")

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, kernel: str | None = None
    ) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias)
        dense = weight.detach().to(torch.bfloat16).contiguous()
        if kernel is None:
            kernel = "aten"
            if gemv.serves(dense):
                kernel = "amx" if gemv.amx() and gemv.amx_fits(dense) else "loop"
        if kernel not in self.KERNELS:
            raise ValueError(f"BF16Linear kernel {kernel!r}: use one of {self.KERNELS}")
        self.kernel = kernel
        self.register_buffer("weight", gemv.amx_pack(dense) if kernel == "amx" else dense)

    def dense_weight(self) -> torch.Tensor:
        """The `[out, in]` bf16 weights (unpacked from the tiles' layout for "amx")."""
        return gemv.amx_unpack(self.weight) if self.kernel == "amx" else self.weight

    def fixed_call(self) -> gemv.FixedCall | None:
        """The decode-sized call of these weights (the tiles or the loop; None for aten)."""
        if self.kernel == "aten":
            return None
        make = gemv.amx_call if self.kernel == "amx" else gemv.loop_call
        return gemv.cached_call(self, make, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fixed = self.fixed_call()
        y = None if fixed is None else fixed(x)  # decode-sized float32 rows
        if y is not None:
            return y
        if self.kernel == "amx":
            y = gemv.amx_linear(x, self.weight, self.bias)
        elif self.kernel == "loop" and gemv.decode_sized(x):
            y = gemv.small_linear(x, self.weight, self.bias)
        else:
            return self._out(F.linear(x.to(torch.bfloat16), self.weight), x)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel={self.kernel}"


def onednn_available() -> bool:
    """Whether this torch build has the oneDNN (mkldnn) prepacked linear ops."""
    try:
        return bool(torch.backends.mkldnn.is_available()) and hasattr(
            torch.ops.mkldnn, "_linear_pointwise"
        )
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def native_bf16() -> bool:
    """Whether oneDNN's prepacked bf16 linear runs here: a CPU with bfloat16 dot products
    (AVX512-BF16 or AMX tiles) and a oneDNN allowed to use them (`ONEDNN_MAX_CPU_ISA=AVX2`
    on the same CPU refuses the layout), tried once on a tiny weight."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    try:
        if not onednn_available() or not any(getattr(torch.cpu, p, bool)() for p in probes):
            return False
        tiny = torch.ones(16, 32, dtype=torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(tiny, OneDNNLinear.BATCH_HINT)
        torch.ops.mkldnn._linear_pointwise(tiny[:1], packed, None, "none", [], "")
    except RuntimeError:
        return False
    return True


def bf16_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear:
    """The `bf16` format's module for this machine. With ctxlab's compiled kernels (a C
    compiler here): AMX tiles where the CPU has them (1.6x oneDNN's prepacked kernel at 1 to
    16 rows), else the compiled loop for decode rows. Without them: oneDNN's prepacked bf16
    kernel where the CPU has bf16 dot products (1.35-1.45x aten's), aten's `F.linear`
    elsewhere (docs/decode.md). All round the input to bf16, multiply exactly and sum in
    float32; only the order of the sums differs."""
    if weight.device.type == "cpu" and gemv.kernels() is None and native_bf16():
        return OneDNNLinear(weight, bias, torch.bfloat16)
    return BF16Linear(weight, bias)


class OneDNNLinear(PackedLinear):
    """Weights reordered once into oneDNN's blocked layout and run through its prepacked
    linear (the kernel torch's inductor uses on CPU after freezing; vLLM's CPU build calls
    oneDNN the same way). float32 (`fp32-onednn`): the same arithmetic as `nn.Linear`,
    summed in another order, faster at decode-sized calls because nothing is repacked per
    call (1.46x over aten's at 4 rows, docs/decode.md). bfloat16 (`bf16` where the CPU has
    bf16 dot products): the input rounded to bf16, as `F.linear` on bf16 does. A private
    copy: the weights no longer share the file-mapped pages of the cache, and a tied output
    head gets its own copy.
    """

    BATCH_HINT = 16  # rows the layout is chosen for: a hint of 1 is slower from 4 rows on

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias)
        self.fmt = "fp32-onednn" if dtype == torch.float32 else "bf16"
        if not onednn_available():
            raise CtxlabError(
                "--weights fp32-onednn needs torch's oneDNN (mkldnn) ops, which this torch "
                "build lacks; use --weights fp32."
            )
        if weight.device.type != "cpu":
            raise CtxlabError("--weights fp32-onednn runs on CPU only; use fp32 elsewhere.")
        dense = weight.detach().to(dtype).contiguous()
        self.dtype = dtype
        if self.bias is not None:
            self.bias = self.bias.to(dtype)
        self._packed = torch.ops.mkldnn._reorder_linear_weight(dense, self.BATCH_HINT)
        self._bytes = dense.numel() * dense.element_size()

    def weight_bytes(self) -> int:
        return self._bytes + super().weight_bytes()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x if x.dtype == self.dtype else x.to(self.dtype)
        y = torch.ops.mkldnn._linear_pointwise(flat, self._packed, self.bias, "none", [], "")
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def dense_weight(self) -> torch.Tensor:
        """The `[out, in]` weights back out of the packed layout (exact: each is a product
        with 1.0)."""
        eye = torch.eye(self.in_features, dtype=self.dtype)
        return torch.ops.mkldnn._linear_pointwise(eye, self._packed, None, "none", [], "").t()

    def __getstate__(self) -> dict:
        # an mkldnn tensor does not pickle or deepcopy: keep the dense weights instead
        state = self.__dict__.copy()
        state["_packed"] = self.dense_weight().contiguous()
        return state

    def __setstate__(self, state: dict) -> None:
        state["_packed"] = torch.ops.mkldnn._reorder_linear_weight(
            state["_packed"], self.BATCH_HINT
        )
        self.__dict__.update(state)


def _quantized_ops_available() -> bool:
    try:
        return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(
            torch.ops.quantized, "linear_dynamic"
        )
    except (AttributeError, RuntimeError):
        return False


def row_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 codes with one scale per output row (what fbgemm's int8 takes)."""
    w = weight.detach().to(torch.float32)
    scale = torch.maximum(w.amax(1), w.amin(1).neg()).div_(127)
    scale = torch.where(scale > 0, scale, torch.full_like(scale, 1e-8))
    codes = torch.div(w, scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return codes, scale


class Int8Linear(PackedLinear):
    """int8 codes with one scale per output row; each call quantizes its input per token.

    Two kernels (`kernel`, chosen once):
    - "amx": the codes packed into AMX tiles (`gemv.amx_pack`, the same bytes), every call
      through ctxlab's tile loop: each row of x quantized to int8 at its own scale
      (max |x| / 127), exact int32 sums, rescaled (CPUs with AMX, a C compiler here);
    - "fbgemm": fbgemm's dynamic int8 linear, each row scaled to the same range first
      (`_per_token_int8`). `reduce_range` quantizes the input to 7 bits, which fbgemm needs
      on CPUs without VNNI (its AVX2 path sums pairs of u8*s8 products in int16, which can
      saturate); with VNNI the full 8 bits are exact. `int8_reduce_range()` probes the
      kernel once to decide.
    """

    fmt = "int8"
    KERNELS = ("amx", "fbgemm")

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, kernel: str | None = None
    ) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias)
        if weight.device.type != "cpu":
            raise CtxlabError("int8 weights run on CPU only; use bf16 on other devices.")
        codes, scale = row_int8(weight)
        if kernel is None:
            kernel = "amx" if gemv.amx_int8() and gemv.amx_fits(codes) else "fbgemm"
        if kernel not in self.KERNELS:
            raise ValueError(f"Int8Linear kernel {kernel!r}: use one of {self.KERNELS}")
        self.kernel = kernel
        self._bytes = 0  # bytes held outside the buffers (fbgemm's packed handle)
        if kernel == "amx":
            self.register_buffer("codes", gemv.amx_pack(codes))
            self.register_buffer("scale", scale.float().contiguous())
            return
        if not _quantized_ops_available():
            raise CtxlabError(
                "int8 weights need torch's fbgemm quantized ops, which this torch build lacks; "
                "use --weights bf16 or fp32."
            )
        self._packed = _fbgemm_pack(codes, scale)
        self._bytes = codes.numel() + 4 * scale.numel()
        self.reduce_range = int8_reduce_range()

    def weight_bytes(self) -> int:
        return self._bytes + super().weight_bytes()

    @property
    def fuses_rotation(self) -> bool:
        """Whether `forward(x, hadamard_signs=s)` rotates inside the kernel (`RotateInput`)."""
        return self.kernel == "amx"

    def fixed_call(self, hadamard_signs: torch.Tensor | None = None) -> gemv.FixedCall | None:
        """The decode-sized call of these codes (`forward`'s `hadamard_signs`): the tiles
        only (None for fbgemm's kernel)."""
        if self.kernel != "amx":
            return None
        return gemv.cached_call(
            self, gemv.amx_int8_call, self.codes, self.scale, self.bias, hadamard_signs
        )

    def forward(self, x: torch.Tensor, hadamard_signs: torch.Tensor | None = None) -> torch.Tensor:
        """`hadamard_signs` (B values): x times blockdiag(signed_hadamard) with these signs
        first (`rotation.hadamard_signs`): inside the AMX kernel, by a product on fbgemm's."""
        if self.kernel == "amx":
            fixed = self.fixed_call(hadamard_signs)
            y = None if fixed is None else fixed(x)  # decode-sized float32 rows
            if y is not None:
                return y
            y = gemv.amx_int8_linear(x, self.codes, self.scale, self.bias, hadamard_signs)
            return y if y.dtype == x.dtype else y.to(x.dtype)
        flat = x if x.dtype == torch.float32 else x.float()
        if hadamard_signs is not None:
            flat = rotate_rows(flat, hadamard_signs[:, None] * hadamard(hadamard_signs.shape[0]))
        if flat.shape[0] == 1:  # one token: the kernel's per-input scale is per token
            y = _linear_dynamic()(flat, self._packed, self.reduce_range)
            return y if self.bias is None and x.dtype == torch.float32 else self._out(y, x)
        return self._out(_per_token_int8(flat, self._packed, self.reduce_range), x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel={self.kernel}"

    def __getstate__(self) -> dict:
        # the packed handle is not picklable as is; keep its codes and scales instead
        state = self.__dict__.copy()
        if self.kernel == "fbgemm":
            w, _ = torch.ops.quantized.linear_unpack(self._packed)
            state["_packed"] = (w.int_repr(), w.q_per_channel_scales().float())
        return state

    def __setstate__(self, state: dict) -> None:
        if state.get("kernel", "fbgemm") == "fbgemm":
            codes, scale = state["_packed"]
            state["_packed"] = _fbgemm_pack(codes, scale)
        self.__dict__.update(state)


def _per_token_int8(flat: torch.Tensor, packed, reduce_range: bool) -> torch.Tensor:
    """fbgemm's dynamic int8 on several float32 tokens, each quantized at its own scale.

    fbgemm quantizes the whole input with one scale, so one token with large activations
    (the first token's, in down_proj) would coarsen every other token's codes. Each row is
    scaled to the same range first and the output scaled back (the product is linear in each
    row): per-token quantization, same kernel.
    """
    row_max = flat.abs().amax(1, keepdim=True).clamp_min_(1e-30)
    return _linear_dynamic()(flat / row_max, packed, reduce_range).mul_(row_max)


_OP = None


def _linear_dynamic():
    """The C++ operator behind `torch.ops.quantized.linear_dynamic`, called without the
    Python packet's per-call scan for fake script objects (about 2 us, 121 calls a step)."""
    global _OP
    if _OP is None:
        packet = torch.ops.quantized.linear_dynamic
        _OP = getattr(packet, "_op", packet)
    return _OP


def _fbgemm_pack(codes: torch.Tensor, scale: torch.Tensor):
    """fbgemm's packed weight for int8 codes [out, in] with per-row scales."""
    zeros = torch.zeros(codes.shape[0], dtype=torch.int64)
    previous = torch.backends.quantized.engine
    with warnings.catch_warnings():
        # torch 2.13 marks quantized tensors as deprecated; fbgemm's prepack still needs one.
        warnings.simplefilter("ignore", UserWarning)
        q = torch._make_per_channel_quantized_tensor(codes, scale.double(), zeros, 0)
        try:
            torch.backends.quantized.engine = "fbgemm"
            return torch.ops.quantized.linear_prepack(q, None)
        finally:
            torch.backends.quantized.engine = previous


_REDUCE_RANGE: bool | None = None


def int8_reduce_range() -> bool:
    """True when fbgemm's full 8-bit input range saturates on this CPU (no VNNI).

    Probe: 255 * 127 summed in pairs overflows int16; with VNNI (int32 sums) the product is
    exact. Runs once per process, on a tiny matrix.
    """
    global _REDUCE_RANGE
    if _REDUCE_RANGE is None:
        k = 256
        packed = _fbgemm_pack(torch.full((8, k), 127, dtype=torch.int8), torch.full((8,), 1 / 127))
        x = torch.ones(1, k)
        x[0, 0] = 0.0  # input range [0, 1]: 1.0 quantizes to 255
        y = torch.ops.quantized.linear_dynamic(x, packed, False)
        _REDUCE_RANGE = abs(float(y[0, 0]) - (k - 1)) > 0.01 * k
    return _REDUCE_RANGE


# Tokens per call from which Int4Linear runs its int8 copy. All 121 linears on this AVX2
# machine: aten's int4 kernel 34.5 / 185 / 5,430 ms at M = 1 / 16 / 256, fbgemm's int8
# 22.1 / 56.7 / 1,447 ms, so int4 takes 1.6x, 3.3x, 3.8x int8's time as M grows
# (`benchmarks/weight_formats.py --only kernels`, docs/decode.md). Below it (decode batches)
# the file's own 4-bit codes are what runs; 64 is the decode/prefill boundary the engine's
# threads use too (`engine/phase_threads.py`).
WIDE_ROWS = 64


class Int4Linear(PackedLinear):
    """aten's CPU int4 kernel: 4-bit codes, bf16 scale and offset per 32 inputs of a row.

    value = (code - 8) * scale + offset, exactly the GGUF Q4_0/Q4_1 formula (see
    `GroupCodes`); the kernel takes scale and offset in bfloat16, which rounds GGUF's fp16
    scales to 8 significant bits (`rounding_error` reports what that adds).

    Calls of `WIDE_ROWS` tokens or more (prefill) run a second copy: the same weights, their
    input dimension rotated by a signed block Hadamard matrix (which spreads outlier input
    channels, as `rotation.py` does for the int8 format), as an `Int8Linear` (the int8
    format's kernel: AMX tiles or fbgemm); the input is rotated online. It costs about 1
    byte per weight more memory (`weight_bytes` counts it; `decode_bytes` does not, since
    decode never reads it) and adds an int8 rounding to prefill only; `wide=False` builds
    without it.
    """

    fmt = "int4"
    inner_k_tiles = 2  # the packing's inner tile count; 2 is what the CPU kernel tiles by

    def __init__(
        self, codes: GroupCodes, bias: torch.Tensor | None = None, wide: bool = True
    ) -> None:
        rows, cols = codes.codes.shape
        super().__init__(cols, rows, bias)
        if codes.bits != 4 or codes.code_zero != 8:
            raise ValueError("Int4Linear takes 4-bit group codes with code zero 8")
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            codes.codes.to(torch.int32).contiguous(), self.inner_k_tiles
        )
        scale_offset = torch.stack((codes.scale, codes.offset), -1)  # [rows, groups, 2]
        self.register_buffer("packed", packed)
        self.register_buffer(
            "scale_offset", scale_offset.transpose(0, 1).contiguous().to(torch.bfloat16)
        )
        # The copy lives outside the module tree, as an opaque handle would: this module's
        # `weight_bytes` counts it, and a walk over `model.modules()` does not count it twice.
        self.__dict__["_wide"] = None
        can_int8 = gemv.amx_int8() or _quantized_ops_available()
        block = _wide_block(cols) if wide and can_int8 else None
        self.register_buffer("wide_rotation", None)
        self.register_buffer("wide_signs", None)
        if block is not None:
            m = signed_hadamard(block, seed=cols)
            # the values the int4 kernel computes with (bf16 scales and offsets)
            so = self.scale_offset.float().transpose(0, 1)  # [rows, groups, 2]
            grouped = codes.codes.view(rows, -1, GROUP).float() - codes.code_zero
            values = (grouped * so[..., :1] + so[..., 1:]).view(rows, cols)
            self.__dict__["_wide"] = Int8Linear(rotate_rows(values, m))  # the int8 format's kernel
            self.wide_rotation = m.contiguous()
            self.wide_signs = hadamard_signs(m)

    def weight_bytes(self) -> int:
        wide: Int8Linear | None = self._wide
        return super().weight_bytes() + (wide.weight_bytes() if wide is not None else 0)

    def decode_bytes(self) -> int:
        """Bytes a decode step (fewer than `WIDE_ROWS` tokens) reads: the 4-bit copy."""
        held = (self.packed, self.scale_offset, self.bias)
        return sum(b.numel() * b.element_size() for b in held if b is not None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide: Int8Linear | None = self._wide
        if wide is not None and x.shape[0] >= WIDE_ROWS:
            flat = x if x.dtype == torch.float32 else x.float()
            if wide.fuses_rotation:  # the tiles rotate the input as they quantize it
                return self._out(wide.forward(flat, hadamard_signs=self.wide_signs), x)
            return self._out(wide(rotate_rows(flat, self.wide_rotation)), x)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self.packed, GROUP, self.scale_offset
        )
        return self._out(y, x)


def _wide_block(cols: int) -> int | None:
    # 32 wide, as int8's online rotation of down_proj: the rotation is an [M*K/32, 32] x
    # [32, 32] product per call, 5-8 % of an int8 prefill at 64 wide, half that at 32
    return block_for(cols, ONLINE_BLOCK)


class TableEmbedding(nn.Module):
    """A float embedding table held as a buffer in its own dtype (bf16 for `--weights bf16`),
    returned in the model's activation dtype."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.dtype = dtype
        self.register_buffer("weight", weight.detach().contiguous())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight).to(self.dtype)

    def weight_bytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


class GroupInt8Embedding(nn.Module):
    """Embedding rows as int8 codes with a scale per 32 values (GGUF Q8_0 held exactly).

    Only looked-up rows are dequantized, so the table costs a quarter of float32's memory
    and nothing per decode step beyond the rows read.
    """

    def __init__(self, codes: GroupCodes, dtype: torch.dtype) -> None:
        super().__init__()
        if codes.bits != 8 or codes.code_zero != 0:
            raise ValueError("GroupInt8Embedding takes symmetric 8-bit group codes")
        self.num_embeddings, self.embedding_dim = codes.codes.shape
        self.dtype = dtype
        self.register_buffer("codes", codes.codes.contiguous())
        self.register_buffer("scale", codes.scale.contiguous())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.codes[ids].view(-1, self.embedding_dim // GROUP, GROUP).float()
        out = rows * self.scale[ids].view(-1, self.embedding_dim // GROUP, 1)
        return out.view(*ids.shape, self.embedding_dim).to(self.dtype)

    def weight_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())
