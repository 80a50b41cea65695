"""ctxlab's compiled SwiGLU activation and RoPE (`elementwise.c`) against float64 and aten,
and where they stay out.

The activation computes exp itself (a polynomial), so it must match a float64 silu to a few
float32 roundings at every scale; RoPE writes in place into the q|k heads of a fused q|k|v
row, so it must rotate exactly those heads and leave v and the row's other bytes alone.
Marked `isa`: `tests/second_isa.py` reruns them with the kernels built one level lower.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ctxlab import native
from ctxlab.model import elementwise
from ctxlab.model.config import ModelConfig
from ctxlab.model.layers import MLP, Attention, rope_tables

pytestmark = pytest.mark.isa
built = pytest.mark.skipif(
    elementwise.kernel() is None, reason=f"not built: {native.why_not('elementwise')}"
)


def top(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def rope_reference(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """x cos + rotate_half(x) sin in float64, from the angles themselves."""
    x64, a = x.double(), angles.double()[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x64[..., half:], x64[..., :half]), -1)
    return x64 * a.cos() + rotated * a.sin()


@built
@pytest.mark.parametrize(("rows", "inter"), [(1, 1536), (4, 1536), (33, 17), (5, 1), (0, 8)])
@pytest.mark.parametrize("scale", [0.1, 3.0, 40.0])
def test_silu_mul_matches_float64(rows, inter, scale):
    g = torch.Generator().manual_seed(rows * 100 + inter)
    gate_up = torch.randn(rows, 2 * inter, generator=g) * scale
    got = elementwise.silu_mul(gate_up, inter)
    assert got is not None and got.shape == (rows, inter) and got.dtype == torch.float32
    gate, up = gate_up.double().split(inter, dim=-1)
    want = F.silu(gate) * up
    # a few float32 roundings of each value (the polynomial is within 2 ulp of exp); below
    # 1e-30 (gates under about -66) only as small: exp's argument is clamped at 88, so there
    # the kernel gives about 1e-36 where float32 aten underflows to 0 and float64 to 1e-60
    assert bool(((got.double() - want).abs() <= 2e-6 * want.abs() + 1e-30).all())
    assert torch.allclose(got, F.silu(gate_up[:, :inter]) * gate_up[:, inter:], rtol=1e-5)


@built
def test_silu_mul_at_the_range_s_edges():
    gate = torch.tensor([-1e4, -150.0, -88.0, -20.0, -1e-7, 0.0, 1e-7, 20.0, 88.0, 150.0, 1e4])
    got = elementwise.silu_mul(torch.cat((gate, torch.ones_like(gate)))[None], gate.numel())
    assert got is not None
    want = F.silu(gate.double())
    assert torch.allclose(got[0].double(), want, rtol=2e-6, atol=1e-30)
    nan = elementwise.silu_mul(torch.tensor([[float("nan"), 1.0]]), 1)
    assert nan is not None and bool(nan.isnan().all())


@built
def test_silu_mul_reads_a_row_stride():
    """Rows of a wider buffer (a view with a row stride): the other columns are not read."""
    wide = torch.randn(6, 2 * 24 + 5, generator=torch.Generator().manual_seed(1))
    view = wide[:, :48]
    got = elementwise.silu_mul(view, 24)
    assert got is not None
    assert torch.allclose(got, F.silu(view[:, :24]) * view[:, 24:], rtol=1e-5, atol=1e-7)


@built
@pytest.mark.parametrize(
    ("tokens", "nq", "nkv", "dim"), [(1, 9, 3, 64), (7, 9, 3, 64), (3, 4, 1, 256), (2, 2, 2, 6)]
)
def test_rope_rotates_the_q_and_k_heads_in_place_and_nothing_else(tokens, nq, nkv, dim):
    g = torch.Generator().manual_seed(tokens * 10 + dim)
    qkv = torch.randn(tokens, nq + 2 * nkv, dim, generator=g)
    before = qkv.clone()
    angles = torch.randn(tokens, dim, generator=g) * 50
    cos, sin = rope_tables(angles.cos(), angles.sin())
    qk = qkv[:, : nq + nkv]
    assert elementwise.rope_(qk, cos, sin)
    want = rope_reference(before[:, : nq + nkv], angles)
    assert top(qk.double() - want) <= 1e-5 * (1 + top(want))
    assert torch.equal(qkv[:, nq + nkv :], before[:, nq + nkv :])  # v untouched


@built
def test_cases_the_kernels_do_not_take_are_left_to_aten():
    cos, sin = rope_tables(torch.ones(2, 8), torch.zeros(2, 8))
    bf16 = torch.ones(2, 3, 8, dtype=torch.bfloat16)
    assert elementwise.silu_mul(torch.ones(2, 8, dtype=torch.bfloat16), 4) is None
    assert elementwise.silu_mul(torch.ones(8, 2).t(), 4) is None  # last dimension strided
    assert elementwise.silu_mul(torch.ones(2, 9), 4) is None  # not gate | up
    assert not elementwise.rope_(bf16, cos, sin)
    assert not elementwise.rope_(torch.ones(2, 8, 3).transpose(1, 2), cos, sin)
    assert not elementwise.rope_(torch.ones(2, 3, 7), cos, sin)  # odd head size
    x = torch.ones(2, 3, 8, requires_grad=True)
    assert not elementwise.rope_(x, cos, sin)
    with torch.no_grad():
        assert elementwise.rope_(x.detach().clone(), cos, sin)


def tiny_config() -> ModelConfig:
    return ModelConfig(
        arch="llama", vocab_size=64, hidden_size=48, intermediate_size=40, num_layers=1,
        num_heads=4, num_kv_heads=2, head_dim=12, rms_norm_eps=1e-5, max_position=64,
    )  # fmt: skip


class Echo:
    """An attention backend that returns q: the module's output then shows its rotation."""

    def attend(self, layer_idx, q, k, v):
        self.k = k.clone()
        return q


def test_the_modules_give_aten_s_answers_with_or_without_the_kernels(monkeypatch):
    cfg = tiny_config()
    torch.manual_seed(0)
    mlp, attn = MLP(cfg), Attention(cfg, 0)
    x = torch.randn(5, cfg.hidden_size)
    angles = torch.arange(5.0)[:, None] * torch.linspace(0.1, 1.0, cfg.head_dim)
    cos, sin = rope_tables(angles.cos(), angles.sin())
    outs = []
    for kernels in (True, False):
        if not kernels:
            monkeypatch.setattr(elementwise, "kernel", lambda: None)
        backend = Echo()
        with torch.inference_mode():
            outs.append((mlp(x), attn(x, cos, sin, backend), backend.k))
    for compiled, fallback in zip(*outs, strict=True):
        assert torch.allclose(compiled, fallback, rtol=1e-5, atol=1e-6)
