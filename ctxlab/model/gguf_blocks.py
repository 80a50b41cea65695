"""The bits of GGUF's 32-value block formats, as codes and per-group scales.

ctxlab's packed weight formats can hold some GGUF blocks exactly, so they take the file's own
codes instead of re-quantizing a dequantized copy (which would add a second rounding):

- Q4_0 (18 bytes per 32 values): fp16 scale d, 16 bytes of nibbles; value = (q - 8) * d.
- Q4_1 (20 bytes): fp16 scale d, fp16 minimum m, 16 bytes of nibbles; value = q * d + m.
- Q8_0 (34 bytes): fp16 scale d, 32 signed bytes; value = q * d.

In a nibble block, byte j holds value j in its low nibble and value j + 16 in its high one.
Layouts: ggml's `ggml-common.h` (block_q4_0, block_q4_1, block_q8_0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP = 32  # values per block in every format here

# ggml type ids (gguf.GGMLQuantizationType)
Q4_0, Q4_1, Q8_0 = 2, 3, 8
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34}
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0"}


@dataclass(frozen=True)
class GroupCodes:
    """A [rows, cols] matrix as codes with one scale (and offset) per 32 values of a row.

    value[r, c] = (codes[r, c] - code_zero) * scale[r, c // 32] + offset[r, c // 32]
    4-bit formats: codes in 0..15, code_zero 8 (Q4_0 has offset 0; Q4_1's offset is
    m + 8 d). Q8_0: codes in -128..127, code_zero 0, offset 0.
    """

    codes: torch.Tensor  # uint8 (4-bit) or int8 (8-bit), [rows, cols]
    scale: torch.Tensor  # float32 [rows, cols // 32]
    offset: torch.Tensor  # float32 [rows, cols // 32]
    code_zero: int
    bits: int
    source: str  # the GGUF type name the codes came from, or "float" when quantized here

    def dequantize(self) -> torch.Tensor:
        rows, cols = self.codes.shape
        q = self.codes.to(torch.float32).sub_(self.code_zero).view(rows, cols // GROUP, GROUP)
        return (q * self.scale[..., None] + self.offset[..., None]).view(rows, cols)

    @staticmethod
    def cat(parts: list[GroupCodes]) -> GroupCodes:
        """Row-wise concatenation (fused q|k|v and gate|up projections)."""
        first = parts[0]
        if any((p.code_zero, p.bits) != (first.code_zero, first.bits) for p in parts):
            raise ValueError("cannot concatenate codes of different formats")
        return GroupCodes(
            torch.cat([p.codes for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat([p.offset for p in parts]),
            first.code_zero,
            first.bits,
            "+".join(sorted({p.source for p in parts})),
        )


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head row interleave of Q/K (rows [h, d/2, 2] -> [h, 2, d/2])."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def decode_blocks(qtype: int, data: np.ndarray) -> GroupCodes | None:
    """Codes of a GGUF tensor's raw bytes [rows, bytes per row]; None for other types."""
    if qtype not in BLOCK_BYTES:
        return None
    rows = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(rows, -1, BLOCK_BYTES[qtype])
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if qtype == Q8_0:
        codes = blocks[..., 2:].copy().view(np.int8).reshape(rows, -1)
        return GroupCodes(
            torch.from_numpy(codes),
            torch.from_numpy(d),
            torch.zeros(d.shape, dtype=torch.float32),
            0,
            8,
            NAMES[qtype],
        )
    head = 4 if qtype == Q4_1 else 2
    packed = blocks[..., head:]  # [rows, groups, 16]
    nibbles = np.concatenate((packed & 0x0F, packed >> 4), axis=-1).reshape(rows, -1)
    if qtype == Q4_1:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        offset = m + 8 * d  # q*d + m == (q - 8)*d + (m + 8d)
    else:
        offset = np.zeros_like(d)
    return GroupCodes(
        torch.from_numpy(nibbles),
        torch.from_numpy(d),
        torch.from_numpy(offset),
        8,
        4,
        NAMES[qtype],
    )


def quantize_groups(weight: torch.Tensor, bits: int) -> GroupCodes:
    """Group-wise codes of a float matrix: 4 bits with a minimum (as Q4_1), 8 bits symmetric
    (as Q8_0), rounding to nearest. For weights that do not come as GGUF blocks."""
    rows, cols = weight.shape
    if cols % GROUP:
        raise ValueError(f"{cols} columns are not a multiple of the group size {GROUP}")
    w = weight.detach().to(torch.float32).view(rows, cols // GROUP, GROUP)
    if bits == 8:
        scale = w.abs().amax(-1) / 127
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.round(w / safe[..., None]).clamp_(-127, 127).to(torch.int8)
        return GroupCodes(codes.view(rows, cols), scale, torch.zeros_like(scale), 0, 8, "float")
    if bits != 4:
        raise ValueError(f"{bits}-bit groups are not supported (4 or 8)")
    low, high = w.amin(-1), w.amax(-1)
    scale = (high - low) / 15
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round((w - low[..., None]) / safe[..., None]).clamp_(0, 15).to(torch.uint8)
    return GroupCodes(codes.view(rows, cols), scale, low + 8 * scale, 8, 4, "float")
