"""Rotate the residual stream so int8 activations have no outlier channels.

fbgemm's int8 kernel quantizes each token's input with one scale (`qlinear.Int8Linear`). A
few channels of a transformer's activations are 10-100x larger than the rest (here up to 85x
in down_proj's input), so one scale leaves the ordinary channels a handful of levels: on the
default model that costs +3.8 % perplexity. An orthogonal rotation spreads each outlier over
many channels, and it is exact: the model computes the same function in another basis.

What is done here (the construction of QuaRot, Ashkboos et al. 2024, without its 4-bit
parts, and with block-diagonal Hadamard matrices, which are cheap to apply):
- Each RMSNorm's weight is folded into the linear layers that read it (q|k|v, gate|up, the
  output head), leaving norms that only normalize, which commute with rotations.
- The residual stream is rotated by Q = S kron(R, H64) (H64 a Hadamard matrix, R a seeded
  random orthogonal matrix mixing the 64-wide blocks, S a seeded diagonal of random signs),
  built once as a dense d x d matrix: readers W -> W Q, writers (o_proj, down_proj)
  W -> Q^T W, and the embedding's output is rotated as it is looked up (`RotateOutput`), so
  the table keeps the GGUF's own Q8_0 codes. Q, K and V come out unchanged, so the KV
  cache, the policies and the logits see what the unrotated model computes.
- down_proj's input (after SiLU, which no rotation passes through) is rotated online by a
  block-diagonal Hadamard matrix (`RotateInput`), folded into down_proj's columns.
Applied to float weights before they are quantized; the int8 format uses it (docs/decode.md).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ctxlab.model.gemv import FixedCall

# Hadamard blocks. Perplexity vs fp32 on the shipped text (4 x 1,024 tokens), int8: +3.8 %
# unrotated. With the residual rotation here and down_proj's online block at 128 / 64 / 32 /
# 16 / none: +0.34 / -0.16 / +0.13 / +0.48 / +1.0 %; with a block-diagonal residual rotation
# (no R) instead, +0.5 to +1.1 %. Seeds 0-3 of R with the block at 128: +0.72, +0.38, +0.22,
# -0.50 %: differences under ~0.5 % are what another seed changes.
RESIDUAL_BLOCK = 64
ONLINE_BLOCK = 32


def hadamard(n: int) -> torch.Tensor:
    """The n x n Sylvester-Hadamard matrix scaled to be orthogonal (n a power of two)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size {n} is not a power of two")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / math.sqrt(n)


def block_for(width: int, largest: int) -> int | None:
    """The largest power of two <= `largest` (and >= 16) that divides `width`."""
    block = largest
    while block >= 16:
        if width % block == 0:
            return block
        block //= 2
    return None


def signed_hadamard(block: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    signs = (torch.randint(0, 2, (block,), generator=g) * 2 - 1).float()
    return signs[:, None] * hadamard(block)


def hadamard_signs(m: torch.Tensor) -> torch.Tensor | None:
    """The signs s with m == diag(s) @ hadamard(B) (what `signed_hadamard` builds), as
    float32, or None when m is not of that form: a kernel that knows the form rotates by a
    fast Walsh-Hadamard transform instead of a product."""
    b = m.shape[0]
    if m.dim() != 2 or m.shape != (b, b) or b < 1 or b & (b - 1):
        return None
    signs = torch.sign(m[:, 0].float())
    if not torch.allclose(m.float(), signs[:, None] * hadamard(b), atol=1e-6):
        return None
    return signs.contiguous()


def residual_rotation(dim: int, block: int, seed: int) -> torch.Tensor:
    """Q = S kron(R, H_block), dim x dim, orthogonal."""
    g = torch.Generator().manual_seed(seed)
    signs = (torch.randint(0, 2, (dim,), generator=g) * 2 - 1).float()
    r, _ = torch.linalg.qr(torch.randn(dim // block, dim // block, generator=g).double())
    return signs[:, None] * torch.kron(r.float().contiguous(), hadamard(block))


def rotate_rows(w: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """w @ blockdiag(m, m, ...) for w [n, d] (m may be the whole d x d): one GEMM."""
    n, d = w.shape
    return (w.float().reshape(-1, m.shape[0]) @ m).view(n, d)


class RotateInput(nn.Module):
    """x -> inner(x @ blockdiag(m)): the online rotation of down_proj's input."""

    def __init__(self, inner: nn.Module, m: torch.Tensor) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("m", m.contiguous())
        # an int8 kernel that rotates as it reads (`Int8Linear.fuses_rotation`) takes the signs
        signs = hadamard_signs(m) if getattr(inner, "fuses_rotation", False) else None
        self.register_buffer("signs", signs)

    def fixed_call(self) -> FixedCall | None:
        """The decode-sized call of the inner layer with the rotation inside it, or None."""
        make = getattr(self.inner, "fixed_call", None)  # signs: an inner that rotates itself
        return None if self.signs is None or make is None else make(self.signs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.signs is not None:
            return self.inner.forward(x, hadamard_signs=self.signs)
        t, k = x.shape
        rotated = torch.mm(x.reshape(-1, self.m.shape[0]), self.m.to(x.dtype)).view(t, k)
        return self.inner.forward(rotated)


class RotateOutput(nn.Module):
    """ids -> inner(ids) @ blockdiag(m): the embedding, looked up then rotated."""

    def __init__(self, inner: nn.Module, m: torch.Tensor) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("m", m.contiguous())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.inner.forward(ids)
        return torch.mm(x.reshape(-1, self.m.shape[0]), self.m.to(x.dtype)).view(x.shape)


@torch.no_grad()
def rotate_residual(model: nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Fold the norms and rotate the float weights of the decoder layers in place.

    Returns the rotated output head ("head"), the residual rotation block ("residual", for
    `RotateOutput` around the embedding) and down_proj's online rotation ("down", for
    `RotateInput`; None when the width has no power-of-two block >= 16). The float model
    computes the same logits afterwards (up to float rounding) when these are used.
    """
    cfg = model.config
    rblock = block_for(cfg.hidden_size, RESIDUAL_BLOCK)
    if rblock is None:
        raise ValueError(f"hidden size {cfg.hidden_size} has no power-of-two block >= 16")
    q = residual_rotation(cfg.hidden_size, rblock, seed)
    table = model.embed_tokens.weight
    head = table if model.lm_head is None else model.lm_head.weight
    new_head = rotate_rows(head.float() * model.norm.weight.float(), q)
    model.norm.weight.fill_(1.0)
    dblock = block_for(cfg.intermediate_size, ONLINE_BLOCK)
    down_m = None if dblock is None else signed_hadamard(dblock, seed + 1)
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        readers = (
            (attn.qkv_proj, layer.input_layernorm),
            (mlp.gate_up_proj, layer.post_attention_layernorm),
        )
        for lin, norm in readers:
            folded = rotate_rows(lin.weight.float() * norm.weight.float(), q)
            lin.weight.copy_(folded.to(lin.weight.dtype))
            norm.weight.fill_(1.0)
        attn.o_proj.weight.copy_(rotate_rows(attn.o_proj.weight.t(), q).t())
        down = rotate_rows(mlp.down_proj.weight.t(), q).t()
        if down_m is not None:
            down = rotate_rows(down, down_m)
        mlp.down_proj.weight.copy_(down)
    return {"head": new_head, "residual": q, "down": down_m}
