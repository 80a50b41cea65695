"""A tiny random-weight Llama-shaped decoder and a no-cache greedy oracle.

The engine only sees the model through `forward(input_ids, positions, backend)` and
`compute_logits`, so a toy with the same seam tests scheduling, paging, chunking, prefix
reuse and preemption in milliseconds. The oracle recomputes the whole sequence with plain
causal attention every step (no cache at all), an independent path to the same answer.
float64 keeps ties in argmax out of the comparison.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

CFG = SimpleNamespace(
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    hidden=32,
    vocab_size=50,
    max_position=512,
    eos_token_ids=(),
    sliding_windows=(),
)


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=x.dtype) / d))
    ang = pos.to(x.dtype)[:, None] * inv[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class ToyRope:
    """What the policy runtime needs from a model's RoPE: moving rotated keys by delta positions."""

    def shift_keys(self, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return rope(k, delta)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Toy tensors are tiny; extra threads only add contention on a shared CPU. Import it
    into a test module (`from engine_toy_model import one_torch_thread`) to apply it there."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class ToyModel(nn.Module):
    def __init__(self, seed: int = 0, with_rope: bool = False):
        super().__init__()
        if with_rope:
            self.rope = ToyRope()
        g = torch.Generator().manual_seed(seed)
        c = CFG
        self.cfg = c

        def w(*shape):
            return nn.Parameter(torch.randn(*shape, generator=g, dtype=torch.float64) * 0.3)

        self.emb = w(c.vocab_size, c.hidden)
        self.layers = nn.ModuleList()
        for _ in range(c.num_layers):
            layer = nn.Module()
            layer.q = w(c.num_heads * c.head_dim, c.hidden)
            layer.k = w(c.num_kv_heads * c.head_dim, c.hidden)
            layer.v = w(c.num_kv_heads * c.head_dim, c.hidden)
            layer.o = w(c.hidden, c.num_heads * c.head_dim)
            layer.up = w(2 * c.hidden, c.hidden)
            layer.down = w(c.hidden, 2 * c.hidden)
            self.layers.append(layer)
        self.head = w(c.vocab_size, c.hidden)

    def forward(self, input_ids, positions, backend):
        c = self.cfg
        x = self.emb[input_ids]
        for i, layer in enumerate(self.layers):
            h = F.normalize(x, dim=-1)
            T = h.shape[0]
            q = rope((h @ layer.q.T).view(T, c.num_heads, c.head_dim), positions)
            k = rope((h @ layer.k.T).view(T, c.num_kv_heads, c.head_dim), positions)
            v = (h @ layer.v.T).view(T, c.num_kv_heads, c.head_dim)
            a = backend.attend(i, q, k, v)
            x = x + a.reshape(T, -1) @ layer.o.T
            x = x + torch.tanh(F.normalize(x, dim=-1) @ layer.up.T) @ layer.down.T
        return F.normalize(x, dim=-1)

    def compute_logits(self, hidden):
        return hidden @ self.head.T * 4.0


class DenseCausal:
    """Plain causal attention over the tokens of this forward only (one sequence)."""

    def attend(self, layer_idx, q, k, v):
        g = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(g, 1)
        v = v.repeat_interleave(g, 1)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
        )
        return o.transpose(0, 1)


@torch.inference_mode()
def oracle_greedy(model: ToyModel, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    out = []
    for _ in range(n):
        t = torch.tensor(ids)
        h = model.forward(t, torch.arange(len(ids)), DenseCausal())
        tok = int(model.compute_logits(h[-1:]).argmax(-1))
        out.append(tok)
        ids.append(tok)
    return out
