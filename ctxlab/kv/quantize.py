"""Quantization arithmetic of KV storage: codes, scales, bit packing and the byte formula.

Two formats (the pool's `QuantKVPool` and the pure `ctxlab.policy.quant.QuantKV` both use
these functions, so they agree bit for bit):
- int8 per token: symmetric absmax, one float32 scale per (token, head) vector.
- KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", ICML
  2024, arXiv:2402.02750), 4 or 2 bits, asymmetric (scale and zero point): keys per channel
  over a group of tokens, values per token over groups of channels.

Codes are bit-packed along the last dim (two 4-bit or four 2-bit codes per byte); scales
and zero points are float32. `kv_bytes` is the exact byte formula.
"""

from __future__ import annotations

import torch

FORMATS = ("int8", "kivi4", "kivi2")
BITS = {"int8": 8, "kivi4": 4, "kivi2": 2}
SCALE_BYTES = 4  # float32 scales and zero points


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes < 2**bits, last dim a multiple of 8 // bits -> packed uint8."""
    per = 8 // bits
    c = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, per)
    out = torch.zeros(c.shape[:-1], dtype=torch.uint8, device=codes.device)
    for i in range(per):
        out |= c[..., i] << (i * bits)
    return out


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of `pack_bits` (no shift for the low codes, no mask for the high ones:
    a broadcast shift over a new last dim is 4x slower on a CPU)."""
    per = 8 // bits
    mask = (1 << bits) - 1
    parts = []
    for i in range(per):
        x = packed >> (i * bits) if i else packed
        parts.append(x & mask if i < per - 1 else x)
    return torch.stack(parts, dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * per)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-vector (last dim) symmetric int8: returns (codes int8, scale float32 [..., 1])."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(xf / safe).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale


def quantize_asym(
    x: torch.Tensor, bits: int, dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric min/max quantization reducing over `dim`: (codes uint8, scale, zero)."""
    xf = x.float()
    lo = xf.amin(dim=dim, keepdim=True)
    hi = xf.amax(dim=dim, keepdim=True)
    levels = (1 << bits) - 1
    scale = (hi - lo) / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((xf - lo) / safe).clamp(0, levels).to(torch.uint8)
    return q, scale, lo


def dequantize_asym(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    return q.float() * scale + zero


def kv_bytes(
    n_tokens: int,
    d_k: int,
    d_v: int,
    fmt: str,
    group: int = 32,
    full_dtype_bytes: int = 4,
    v_group: int | None = None,
) -> int:
    """Exact bytes of `n_tokens` tokens of one lane stored in `fmt` (scales included).

    KIVI: keys in groups of `group` tokens (a scale and a zero point per channel and group),
    values in groups of `v_group` channels (default `group`; a scale and a zero point per
    token and group); the last `n_tokens % group` tokens are still in full precision.
    """
    if fmt == "int8":
        return n_tokens * (d_k + d_v + 2 * SCALE_BYTES)
    bits = BITS[fmt]
    vg = group if v_group is None else v_group
    n_groups, resid = divmod(n_tokens, group)
    q_tok = n_groups * group
    k = q_tok * d_k * bits // 8 + n_groups * d_k * 2 * SCALE_BYTES
    v = q_tok * d_v * bits // 8 + q_tok * (d_v // vg) * 2 * SCALE_BYTES
    return k + v + resid * (d_k + d_v) * full_dtype_bytes
