"""Rotate the residual stream so int8 activations have no outlier channels.

fbgemm's int8 kernel quantizes each token's input with one scale (`qlinear.Int8Linear`). A
few channels of a transformer's activations are 10-100x larger than the rest (here up to 85x
in down_proj's input), so one scale leaves the ordinary channels a handful of levels: on the
default model that costs +3.8 % perplexity. An orthogonal rotation spreads each outlier over
every channel, and it is exact: the model computes the same function in another basis.

What is done here (the construction of QuaRot, Ashkboos et al. 2024, without its 4-bit parts):
- Each RMSNorm's weight is folded into the linear layers that read it (q|k|v, gate|up, the
  output head), leaving norms that only normalize, which commute with rotations.
- The residual stream is rotated by an orthogonal Q (random signs times kron(R, H64), R a
  seeded random orthogonal matrix, H64 a Hadamard matrix): embedding rows E -> E Q, readers
  W -> W Q, writers (o_proj, down_proj) W -> Q^T W. Q, K and V come out unchanged, so the KV
  cache, the policies and the logits see exactly what the unrotated model computes.
- down_proj's input (after SiLU, which no rotation passes through) is rotated online by a
  block-diagonal Hadamard matrix (`BlockRotation`), folded into down_proj's columns.
Applied to float weights before they are quantized; the int8 format uses it (docs/decode.md).
"""

from __future__ import annotations

import math

import torch
from torch import nn

BLOCK = 64  # Hadamard block of the residual rotation
# Hadamard block of down_proj's input rotation: perplexity vs fp32 on the shipped text was
# +0.34 % at 128, -0.16 % at 64, +0.13 % at 32, +0.48 % at 16 and +1.0 % without it (all
# within noise of each other but the last); 32 costs a quarter of 128's multiply-adds.
ONLINE_BLOCK = 32


def hadamard(n: int) -> torch.Tensor:
    """The n x n Sylvester-Hadamard matrix scaled to be orthogonal (n a power of two)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size {n} is not a power of two")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / math.sqrt(n)


class StructuredRotation:
    """Q = diag(signs) kron(R, H): orthogonal, applied in O(d * (d/BLOCK + BLOCK)) per row."""

    def __init__(self, dim: int, seed: int = 0) -> None:
        block = math.gcd(dim, BLOCK)
        block = 1 << (block.bit_length() - 1)  # largest power of two dividing dim, <= 64
        g = torch.Generator().manual_seed(seed)
        self.signs = (torch.randint(0, 2, (dim,), generator=g) * 2 - 1).float()
        r, _ = torch.linalg.qr(torch.randn(dim // block, dim // block, generator=g).double())
        self.r = r.float()
        self.h = hadamard(block)
        self.dim, self.block = dim, block

    def right(self, w: torch.Tensor) -> torch.Tensor:
        """w @ Q for w [n, dim]."""
        n = w.shape[0]
        x = (w.float() * self.signs).view(n, self.dim // self.block, self.block) @ self.h
        return torch.einsum("nij,ia->naj", x, self.r).reshape(n, self.dim)

    def left_t(self, w: torch.Tensor) -> torch.Tensor:
        """Q^T @ w for w [dim, m] (a writer's weight)."""
        return self.right(w.t().contiguous()).t().contiguous()


class BlockRotation(nn.Module):
    """x -> x @ blockdiag(H): the online rotation of down_proj's input, then `inner`."""

    def __init__(self, inner: nn.Module, block: int) -> None:
        super().__init__()
        self.inner = inner
        self.block = block
        self.register_buffer("h", hadamard(block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, k = x.shape
        return self.inner(torch.mm(x.reshape(-1, self.block), self.h.to(x.dtype)).view(t, k))


def online_block(width: int) -> int | None:
    """The Hadamard block for an input of this width: ONLINE_BLOCK or a smaller power of two."""
    block = ONLINE_BLOCK
    while block >= 16:
        if width % block == 0:
            return block
        block //= 2
    return None


@torch.no_grad()
def rotate_residual(model: nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Fold the norms and rotate the float weights of `model` in place.

    Returns the new float weights of the output head ("head") and the down_proj Hadamard
    block per layer ("down_block"); the caller quantizes them. The float model computes the
    same logits afterwards (up to float rounding) if the head and `BlockRotation` are used.
    """
    cfg = model.config
    q = StructuredRotation(cfg.hidden_size, seed)
    table = model.embed_tokens.weight
    head = table if model.lm_head is None else model.lm_head.weight
    new_head = q.right(head.float() * model.norm.weight.float())
    model.norm.weight.fill_(1.0)
    table.copy_(q.right(table).to(table.dtype))
    block = online_block(cfg.intermediate_size)
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        readers = (
            (attn.qkv_proj, layer.input_layernorm),
            (mlp.gate_up_proj, layer.post_attention_layernorm),
        )
        for lin, norm in readers:
            folded = q.right(lin.weight.float() * norm.weight.float())
            lin.weight.copy_(folded.to(lin.weight.dtype))
            norm.weight.fill_(1.0)
        attn.o_proj.weight.copy_(q.left_t(attn.o_proj.weight).to(attn.o_proj.weight.dtype))
        down = q.left_t(mlp.down_proj.weight)
        if block is not None:
            rows = down.shape[0]
            down = (down.view(rows, -1, block) @ hadamard(block)).view(rows, -1)
        mlp.down_proj.weight.copy_(down.to(mlp.down_proj.weight.dtype))
    return {"head": new_head, "down_block": torch.tensor(block or 0)}
