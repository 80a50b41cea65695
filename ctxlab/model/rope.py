"""Rotary position embedding and its context-extension variants.

Each scaling kind only changes the inverse frequencies (and, for YaRN, a scale on cos/sin);
the rotation itself is the same. The formulas follow the papers (position interpolation,
"NTK-aware" dynamic scaling, YaRN, the Llama 3.1 report) and are checked against
transformers' `ROPE_INIT_FUNCTIONS` in the tests.

Because rotations at one frequency compose (R(a) R(b) = R(a + b)), keys already rotated to
position p can be moved to position p + d by rotating them by d: `shift_keys` does that for
policies that re-position cached keys (StreamingLLM cache-slot positions).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ctxlab.errors import CtxlabError

ROPE_KINDS = ("default", "linear", "dynamic", "yarn", "llama3")


def base_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """theta^(-2i/d) for i < d/2, in float32."""
    exponents = (
        torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / head_dim
    )
    return 1.0 / (theta**exponents)


def compute_inv_freq(
    head_dim: int,
    theta: float,
    scaling: dict[str, Any] | None,
    max_position: int,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2], attention scaling) for a scaling kind.

    `seq_len` matters only for dynamic NTK, whose base grows with the current length.
    """
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return base_inv_freq(head_dim, theta), 1.0
    assert scaling is not None
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        # Position interpolation: positions divided by factor == frequencies divided by it.
        return base_inv_freq(head_dim, theta) / factor, 1.0
    if kind == "dynamic":
        n = max(seq_len or 0, max_position)
        grown = theta * ((factor * n / max_position) - (factor - 1)) ** (head_dim / (head_dim - 2))
        return base_inv_freq(head_dim, grown), 1.0
    if kind == "yarn":
        return _yarn(head_dim, theta, scaling, max_position)
    if kind == "llama3":
        return _llama3(head_dim, theta, scaling), 1.0
    raise CtxlabError(f"RoPE scaling kind {kind!r} is not supported; use one of {ROPE_KINDS}.")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(
    head_dim: int, theta: float, s: dict[str, Any], max_position: int
) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): interpolate low frequencies, keep high ones, ramp between."""
    original = int(s["original_max_position_embeddings"])
    factor = s.get("factor") or max_position / original
    attention = s.get("attention_factor")
    if attention is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            attention = _yarn_mscale(factor, s["mscale"]) / _yarn_mscale(
                factor, s["mscale_all_dim"]
            )
        else:
            attention = _yarn_mscale(factor)
    beta_fast = s.get("beta_fast") or 32
    beta_slow = s.get("beta_slow") or 1

    def dim_for(rotations: float) -> float:
        # The dimension index whose wavelength makes `rotations` turns over `original` tokens.
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_for(beta_fast), dim_for(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = (
        (torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)
    ).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the original frequency), 0: interpolate
    inv = base_inv_freq(head_dim, theta)
    inv_freq = (inv / factor) * (1 - keep) + inv * keep
    return inv_freq, float(attention)


def _llama3(head_dim: int, theta: float, s: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: divide long wavelengths by factor, keep short ones, blend the middle."""
    inv = base_inv_freq(head_dim, theta)
    factor = float(s["factor"])
    low_ff, high_ff = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    original = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = original / low_ff, original / high_ff
    out = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low_ff) / (high_ff - low_ff)
    blended = (1 - smooth) * out / factor + smooth * out
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, out)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last dimension: the half-split (NeoX / HF) RoPE layout."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, d] by per-token cos/sin [T, d]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding:
    """Per-token cos/sin for a model; frequencies fixed at build time except for dynamic NTK."""

    def __init__(
        self,
        head_dim: int,
        theta: float,
        scaling: dict[str, Any] | None,
        max_position: int,
        freq_factors: torch.Tensor | None = None,
    ) -> None:
        self.head_dim = head_dim
        self.theta = theta
        self.scaling = scaling
        self.max_position = max_position
        self.kind = (scaling or {}).get("rope_type", "default")
        if self.kind not in ROPE_KINDS:
            raise CtxlabError(
                f"RoPE scaling kind {self.kind!r} is not supported; use one of {ROPE_KINDS}."
            )
        # llama.cpp stores Llama 3 scaling as per-frequency divisors (`rope_freqs.weight`).
        self.freq_factors = freq_factors
        self.inv_freq, self.attention_scaling = self._inv_freq(None)

    def _inv_freq(self, seq_len: int | None) -> tuple[torch.Tensor, float]:
        inv, scale = compute_inv_freq(
            self.head_dim, self.theta, self.scaling, self.max_position, seq_len
        )
        if self.freq_factors is not None:
            inv = inv / self.freq_factors.to(torch.float32)
        return inv, scale

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype, scaled: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, head_dim] for integer positions [T], computed in float32 then cast.

        Dynamic NTK recomputes the base from the longest position in this call, as
        transformers does from the batch's largest position.
        """
        inv = self.inv_freq
        scale = self.attention_scaling if scaled else 1.0
        if self.kind == "dynamic" and positions.numel():
            inv, scale = self._inv_freq(int(positions.max()) + 1)
        return _cos_sin(inv, positions, scale, dtype)

    def shift_keys(self, k: torch.Tensor, delta: torch.Tensor | int) -> torch.Tensor:
        """Move already-rotated keys k [T, heads, d] by `delta` positions (per token or scalar).

        No attention scaling here: the keys carry it already from their first rotation.
        """
        if isinstance(delta, int):
            delta = torch.full((k.shape[0],), delta, dtype=torch.int64, device=k.device)
        # The frequencies the keys were built with; a dynamic-NTK base change is not undone.
        cos, sin = _cos_sin(self.inv_freq, delta.to(k.device), 1.0, torch.float32)
        return apply_rotary(k.to(torch.float32), cos, sin).to(k.dtype)


def _cos_sin(
    inv: torch.Tensor, positions: torch.Tensor, scale: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    angles = positions.to(torch.float32)[:, None] * inv.to(positions.device)[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)
