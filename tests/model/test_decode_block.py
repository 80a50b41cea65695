"""The compiled decode block (`decode_block.c`) against the decoder layer's Python path.

Both run the same kernels in the same order, so a layer's output must be the same bits
either way, for each weight format that offers fixed calls and every decode row count; a
swapped argument, a wrong scratch offset or a missed residual is off by order one. Marked
`isa`: `tests/second_isa.py` reruns them with the kernels built for AVX2 (no AMX tiles: the
bf16 format takes the loop there, and int8 has no block).
"""

from __future__ import annotations

import pytest
import torch

from ctxlab import native
from ctxlab.model import decode_block, gemv
from ctxlab.model.config import ModelConfig
from ctxlab.model.layers import DecoderLayer, rope_tables
from ctxlab.model.qlinear import BF16Linear, Int8Linear
from ctxlab.model.rotation import RotateInput, signed_hadamard

pytestmark = [
    pytest.mark.isa,
    pytest.mark.skipif(
        decode_block.kernel() is None,
        reason=f"the block is not built: {native.why_not('decode_block')}",
    ),
]


def config(bias: bool = False, qk_norm: bool = False) -> ModelConfig:
    return ModelConfig(
        arch="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=1,
        num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position=64,
        attention_bias=bias, qk_norm=qk_norm,
    )  # fmt: skip


class Mixer:
    """An attention backend that mixes q with k and v (each row's own), so q, k and v all
    reach the output: [T, heads, d]."""

    def attend(self, layer_idx, q, k, v):
        group = q.shape[1] // k.shape[1]
        kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return torch.tanh(q * kk) + vv


def layer_in(fmt: str, bias: bool = False) -> DecoderLayer:
    torch.manual_seed(1)
    layer = DecoderLayer(config(bias), 0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
        layer.input_layernorm.weight.add_(1.0)
        layer.post_attention_layernorm.weight.add_(1.0)
    if fmt == "fp32":
        return layer
    for owner, name in (
        (layer.self_attn, "qkv_proj"), (layer.self_attn, "o_proj"),
        (layer.mlp, "gate_up_proj"), (layer.mlp, "down_proj"),
    ):  # fmt: skip
        lin = getattr(owner, name)
        w, b = lin.weight.detach(), None if lin.bias is None else lin.bias.detach()
        if fmt == "bf16":
            setattr(owner, name, BF16Linear(w, b))
        elif name == "down_proj":  # int8 with the online rotation inside the kernel
            m = signed_hadamard(32, seed=3)
            rotated = (w.reshape(-1, 32) @ m).reshape(w.shape)
            setattr(owner, name, RotateInput(Int8Linear(rotated, b), m))
        else:
            setattr(owner, name, Int8Linear(w, b))
    return layer


def tables(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.arange(rows, dtype=torch.float32)[:, None] * torch.linspace(0.1, 1.0, 16)
    return rope_tables(angles.cos(), angles.sin())


def python_path(layer: DecoderLayer, x, cos, sin, monkeypatch) -> torch.Tensor:
    with monkeypatch.context() as m:
        m.setattr(decode_block, "kernel", lambda: None)
        layer.__dict__.pop("_decode_block", None)
        with torch.inference_mode():
            y = layer(x, cos, sin, Mixer())
    layer.__dict__.pop("_decode_block", None)
    return y


FORMATS = ["fp32", "bf16", "int8"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 3, gemv.MAX_ROWS])
@pytest.mark.parametrize("bias", [False, True])
def test_the_block_is_the_python_layer_bit_for_bit(fmt, rows, bias, monkeypatch):
    if fmt == "int8" and not gemv.amx_int8():
        pytest.skip("int8 offers fixed calls on AMX tiles only")
    layer = layer_in(fmt, bias)
    x = torch.randn(rows, 64)
    cos, sin = tables(rows)
    with torch.inference_mode():
        got = layer(x, cos, sin, Mixer())
    _key, block = layer.__dict__["_decode_block"]
    assert isinstance(block, decode_block.DecodeBlock)  # the block ran
    assert torch.equal(got, python_path(layer, x, cos, sin, monkeypatch))


def test_the_block_follows_its_weights_when_they_move(monkeypatch):
    """A storage swapped in (`t.data = ...`, as huge pages do) makes a new block that reads
    the new weights."""
    layer = layer_in("fp32")
    x = torch.randn(2, 64)
    cos, sin = tables(2)
    with torch.inference_mode():
        first = layer(x, cos, sin, Mixer())
        old = layer.__dict__["_decode_block"][1]
        layer.mlp.down_proj.weight.data = layer.mlp.down_proj.weight.data * 2
        layer.post_attention_layernorm.weight.data = layer.post_attention_layernorm.weight * 0.5
        moved = layer(x, cos, sin, Mixer())
    assert layer.__dict__["_decode_block"][1] is not old
    assert not torch.equal(moved, first)
    assert torch.equal(moved, python_path(layer, x, cos, sin, monkeypatch))


def test_the_block_steps_aside_where_it_does_not_apply(monkeypatch):
    """More rows than a decode step's, bf16 activations, per-head q/k norms or a format
    without fixed calls take the Python path (and give its answer)."""
    layer = layer_in("fp32")
    cos, sin = tables(gemv.MAX_ROWS + 1)
    x = torch.randn(gemv.MAX_ROWS + 1, 64)
    with torch.inference_mode():
        layer(x, cos, sin, Mixer())
    assert "_decode_block" not in layer.__dict__  # never consulted at prefill sizes
    block = decode_block.for_layer(
        layer,
        (layer.input_layernorm, layer.post_attention_layernorm),
        (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
         layer.mlp.down_proj),
        6, 16,
    )  # fmt: skip
    assert block is not None
    c2, s2 = tables(2)
    assert block.pre(torch.randn(2, 64).bfloat16(), c2, s2) is None
    assert block.pre(torch.randn(2, 128)[:, ::2], c2, s2) is None  # not contiguous
    assert block.pre(torch.randn(2, 64), *tables(3)) is None  # tables of other rows
    assert block.post(torch.randn(3, 64), torch.randn(2, 64)) is None

    qk = DecoderLayer(config(qk_norm=True), 0)
    x2 = torch.randn(2, 64)
    with torch.inference_mode():
        qk(x2, c2, s2, Mixer())
    assert "_decode_block" not in qk.__dict__

    fb = layer_in("fp32")
    w = fb.mlp.down_proj.weight.detach()
    fb.mlp.down_proj = Int8Linear(w, kernel="fbgemm")  # no fixed call: no block
    with torch.inference_mode():
        got = fb(x2, c2, s2, Mixer())
    assert fb.__dict__["_decode_block"][1] is None
    assert torch.equal(got, python_path(fb, x2, c2, s2, monkeypatch))


def test_the_int8_layer_rotates_inside_its_down_projection():
    """The int8 case above takes the rotation path it means to (signs inside the kernel)."""
    if not gemv.amx_int8():
        pytest.skip("int8 offers fixed calls on AMX tiles only")
    down = layer_in("int8").mlp.down_proj
    assert isinstance(down, RotateInput) and down.signs is not None
    call = down.fixed_call()
    assert call is not None and call.spec.rotation and call.spec.block == 32


def test_autograd_keeps_the_python_path():
    """With gradients wanted the layer runs its Python path, so autograd sees every op."""
    layer = layer_in("fp32")
    x = torch.randn(2, 64, requires_grad=True)
    layer(x, *tables(2), Mixer()).sum().backward()
    assert x.grad is not None and layer.mlp.down_proj.weight.grad is not None
    assert "_decode_block" not in layer.__dict__
