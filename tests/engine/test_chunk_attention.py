"""A prefill chunk's attention on AMX tiles (`engine/kernels/chunk_attention`) against SDPA.

The kernel reads a pool's blocks in place (float32 or bf16 rows, blocks in any order), rounds
keys and values to bf16 and multiplies on tiles: its error against float32 attention on the
same rows must be of the size SDPA's own bf16 path has, for a causal mask offset by a cached
prefix, a sliding window, an arbitrary additive mask, rows that do not fill a tile and key
counts that do not fill one. A span and the bias it stands for give the same bytes. In the
engine, a chunk after a cached prefix takes the kernel and samples what the SDPA path does.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ctxlab.engine import LLM, SamplingParams
from ctxlab.engine.kernels import chunk_attention
from ctxlab.kv.layout import KVLayout
from ctxlab.kv.pool import KVPool
from ctxlab.kv.quant_pool import QuantKVPool
from ctxlab.model import load_model

pytestmark = pytest.mark.skipif(
    chunk_attention.library() is None, reason="no AMX bf16 tiles (or no C compiler) here"
)

HKV, GROUP, D = 3, 3, 64


def pool_of(dtype: torch.dtype, blocks: int = 64, d: int = D) -> KVPool:
    layout = KVLayout(n_layers=1, n_kv_heads=HKV, head_dim=d, head_dim_v=d, dtype=dtype)
    pool = KVPool(layout, blocks)
    pool.data.copy_(torch.randn(pool.data.shape, generator=torch.Generator().manual_seed(1)))
    return pool


def case(n: int, nb: int, prev: int, window: int | None, seed: int = 0):
    """q `[Hkv, group * n, d]` bf16, a scattered block table, the spans and the same mask."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(HKV, GROUP * n, D, generator=gen).to(torch.bfloat16)
    table = torch.stack([torch.randperm(64, generator=gen)[:nb] for _ in range(HKV)])
    hi = (prev + torch.arange(1, n + 1)).repeat(GROUP).expand(HKV, GROUP * n)
    lo = (hi - window).clamp(min=0) if window is not None else torch.zeros_like(hi)
    keys = torch.arange(nb * 16).view(1, 1, -1)
    mask = (keys < hi.unsqueeze(-1)) & (keys >= lo.unsqueeze(-1))
    return q, table, (lo, hi), mask


def as_bias(mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=torch.bfloat16).masked_fill_(~mask, float("-inf"))


def exact(q, pool, table, mask):
    k, v = pool.gather(table)
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)


def sdpa_bf16(q, pool, table, mask):
    k, v = pool.gather(table)
    return F.scaled_dot_product_attention(q, k.bfloat16(), v.bfloat16(), attn_mask=as_bias(mask))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("n", "nb", "prev", "window"),
    [(64, 36, 512, None), (5, 5, 70, None), (20, 9, 120, 48), (1, 2, 0, None)],
)
def test_chunk_attention_is_as_close_as_sdpa_bf16(dtype, n, nb, prev, window):
    pool = pool_of(dtype)
    q, table, span, mask = case(n, nb, prev, window)
    want = exact(q, pool, table, mask)
    got = chunk_attention.attend(q, pool, table, span=span)
    assert got is not None and got.shape == want.shape and got.dtype == torch.bfloat16
    err = (got.float() - want).abs().max().item()
    sdpa_err = (sdpa_bf16(q, pool, table, mask).float() - want).abs().max().item()
    assert err <= 2 * sdpa_err + 2e-3, (err, sdpa_err)


def test_a_span_and_its_bias_give_the_same_bytes():
    pool = pool_of(torch.float32)
    q, table, span, mask = case(40, 12, 150, 64, seed=3)
    bias = as_bias(mask)
    by_span = chunk_attention.attend(q, pool, table, span=span)
    by_bias = chunk_attention.attend(q, pool, table, bias=bias)
    assert by_span is not None and by_bias is not None
    assert torch.equal(by_span, by_bias)


def test_an_arbitrary_mask_through_the_bias():
    pool = pool_of(torch.bfloat16)
    q, table, _, causal = case(16, 8, 100, None, seed=5)
    mask = causal & (torch.rand(causal.shape, generator=torch.Generator().manual_seed(7)) > 0.3)
    mask[..., 0] = True  # every row sees a key
    bias = as_bias(mask)
    want = exact(q, pool, table, mask)
    got = chunk_attention.attend(q, pool, table, bias=bias)
    sdpa_err = (sdpa_bf16(q, pool, table, mask).float() - want).abs().max().item()
    assert got is not None and (got.float() - want).abs().max().item() <= 2 * sdpa_err + 2e-3


def test_what_the_kernel_refuses(caplog):
    q, table, span, _ = case(4, 2, 10, None)
    layout = KVLayout(n_layers=1, n_kv_heads=HKV, head_dim=D, head_dim_v=D)
    chunk_attention._refused.cache_clear()
    with caplog.at_level("INFO", logger="ctxlab.engine.kernels.chunk_attention"):
        assert not chunk_attention.takes(QuantKVPool(layout, 8, "int8"))  # codes
    assert "stores codes" in caplog.text
    assert not chunk_attention.takes(pool_of(torch.float32, d=48))  # d not a multiple of 32
    assert chunk_attention.takes(pool_of(torch.float32))
    assert chunk_attention.attend(q.float(), pool_of(torch.float32), table, span=span) is None
    with pytest.raises(ValueError, match="one mask"):
        chunk_attention.attend(q, pool_of(torch.float32), table)


@pytest.mark.model
@pytest.mark.usefixtures("one_torch_thread")
def test_a_chunk_after_a_cached_prefix_takes_the_kernel_and_samples_the_same(
    gguf_path, monkeypatch
):
    model = load_model(str(gguf_path), weights="bf16")
    prefix = list(range(2000, 2100))
    prompts = [prefix + list(range(3000, 3040)), prefix + list(range(4000, 4070))]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    calls = 0
    attend = chunk_attention.attend

    def counting(*args, **kwargs):
        nonlocal calls
        calls += 1
        return attend(*args, **kwargs)

    monkeypatch.setattr(chunk_attention, "attend", counting)

    def run(tiles: bool) -> list[list[int]]:
        engine = LLM(model, kv_pool_tokens=2048).engine
        backend = engine.runner.backend
        backend._chunk_tiles = backend._chunk_tiles and tiles
        first = engine.run_all([engine.add_request(prompts[0], params)])
        second = engine.run_all([engine.add_request(prompts[1], params)])  # a prefix hit
        return [first[0].token_ids, second[0].token_ids]

    with_tiles = run(True)
    taken, calls = calls, 0
    without = run(False)
    assert taken > 0 and calls == 0
    assert with_tiles == without
