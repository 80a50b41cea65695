from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.errors import CtxlabError
from ctxlab.policy.quant import (
    QuantKV,
    dequantize_asym,
    dequantize_int8,
    kv_bytes,
    pack_bits,
    quantize_asym,
    quantize_int8,
    unpack_bits,
)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_round_trip(bits):
    codes = torch.randint(0, 1 << bits, (3, 5, 64), dtype=torch.uint8)
    packed = pack_bits(codes, bits)
    assert packed.shape[-1] == 64 * bits // 8
    assert torch.equal(unpack_bits(packed, bits), codes)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(1e-3, 1e3))
def test_int8_error_bound(seed, scale):
    torch.manual_seed(seed)
    x = torch.randn(4, 7, 64) * scale
    q, s = quantize_int8(x)
    err = (dequantize_int8(q, s) - x).abs()
    # Round to nearest: at most half a step (plus float32 rounding) per element.
    assert torch.all(err <= s * 0.5 + 1e-6 * x.abs().amax(-1, keepdim=True))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), bits=st.sampled_from([2, 4]), dim=st.sampled_from([0, 1]))
def test_asym_error_bound(seed, bits, dim):
    torch.manual_seed(seed)
    x = torch.randn(32, 64) * 3 + 1
    q, s, z = quantize_asym(x, bits, dim)
    err = (dequantize_asym(q, s, z) - x).abs()
    assert torch.all(err <= s * 0.5 + 1e-5)
    assert int(q.max()) <= (1 << bits) - 1


def test_constant_input_is_exact():
    x = torch.full((2, 32, 64), 0.75)
    q, s, z = quantize_asym(x, 2, 1)
    assert torch.equal(dequantize_asym(q, s, z), x)
    q8, s8 = quantize_int8(torch.zeros(3, 8))
    assert torch.equal(dequantize_int8(q8, s8), torch.zeros(3, 8))


@pytest.mark.parametrize("fmt", ["int8", "kivi4", "kivi2"])
@pytest.mark.parametrize("chunks", [[1] * 70, [33, 1, 40], [64], [5]])
def test_quantkv_bytes_are_exact_and_recent_tokens_full_precision(fmt, chunks):
    torch.manual_seed(0)
    store = QuantKV(fmt, d_k=64, d_v=64, group=32, n=3)
    ks, vs = [], []
    for c in chunks:
        k, v = torch.randn(3, c, 64), torch.randn(3, c, 64)
        store.append(k, v)
        ks.append(k)
        vs.append(v)
    k, v = torch.cat(ks, 1), torch.cat(vs, 1)
    n = k.shape[1]
    assert len(store) == n
    assert store.nbytes == 3 * kv_bytes(n, 64, 64, fmt, 32)
    dk, dv = store.dequantize()
    assert dk.shape == k.shape and dv.shape == v.shape
    if fmt != "int8":
        tail = n - n % 32
        assert torch.equal(dk[:, tail:], k[:, tail:]) and torch.equal(dv[:, tail:], v[:, tail:])
        tol = {"kivi4": 0.5, "kivi2": 2.0}[fmt]
    else:
        tol = 0.05
    assert float((dk - k).abs().max()) < tol and float((dv - v).abs().max()) < tol


def test_byte_formula_by_hand():
    # 64 tokens, d=64, kivi2: 2 groups; keys 64*64*2/8 = 1024 B codes + 2 groups*64 ch*8 B;
    # values 1024 B codes + 64 tokens * 2 groups * 8 B.
    assert kv_bytes(64, 64, 64, "kivi2") == 1024 + 1024 + 1024 + 1024
    assert kv_bytes(10, 64, 64, "kivi4") == 10 * 128 * 4  # all still full precision
    assert kv_bytes(3, 64, 64, "int8") == 3 * (128 + 8)
    full_fp32 = 4096 * 128 * 4
    # 2-bit codes + float32 scale/zero per 32 values (2 more bits each) = 4 bits per value.
    assert kv_bytes(4096, 64, 64, "kivi2") == full_fp32 // 8


def test_bad_format_is_a_user_error():
    with pytest.raises(CtxlabError):
        QuantKV("int3", 64, 64)
    with pytest.raises(CtxlabError):
        QuantKV("kivi2", 64, 48, group=32)
