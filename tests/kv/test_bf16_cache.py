"""A bfloat16 cache beside a float32 model (`kv_cache_dtype="bfloat16"`): half the bytes,
every read widened back to the model's dtype, the same answers within bf16's rounding.

Reads must equal the written rows rounded to bf16 (nothing else is lost), come back in the
model's dtype on every path (gather, read_rows, run_view, the decode kernels' views), and
the engine's prompt log-probabilities must stay within a small distance of a float32
cache's on the real model.
"""

from __future__ import annotations

import pytest
import torch

from ctxlab.engine.llm_engine import cache_dtype
from ctxlab.errors import CtxlabError
from ctxlab.kv.layout import KVLayout
from ctxlab.kv.manager import KVCacheManager
from ctxlab.kv.pool import KVPool

F32 = KVLayout(2, 2, 8, 8, block_size=4)
BF16 = KVLayout(2, 2, 8, 8, block_size=4, dtype=torch.bfloat16, compute_dtype=torch.float32)


def written(pool: KVPool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = torch.arange(0, 12).view(3, 4)
    k, v = torch.randn(3, 4, 8, generator=g), torch.randn(3, 4, 8, generator=g)
    pool.write(rows, k, v)
    return rows, k, v


def test_reads_are_the_rows_rounded_to_bf16_in_the_model_dtype():
    pool = KVPool(BF16, num_blocks=8)
    rows, k, v = written(pool)
    want_k, want_v = k.bfloat16().float(), v.bfloat16().float()
    assert not torch.equal(want_k, k)  # the rounding is real, so the checks below can fail
    got_k, got_v = pool.read_rows(rows)
    assert got_k.dtype == torch.float32 and torch.equal(got_k, want_k)
    assert torch.equal(got_v, want_v)
    gk, gv = pool.gather(torch.tensor([[0, 1, 2]]))
    assert gk.dtype == torch.float32 and torch.equal(gk[0], want_k.reshape(12, 8))
    assert torch.equal(gv[0], want_v.reshape(12, 8))
    rk, _ = pool.run_view(0, 3, 1, 0)
    assert rk.dtype == torch.float32 and torch.equal(rk[0], want_k.reshape(12, 8))
    assert not pool.views  # run_view copies: the in-place path is not taken
    kind, (kb, _) = pool.decode_views()
    assert kind == "bf16" and kb.dtype.itemsize == 2


def test_half_the_bytes_of_a_float32_cache():
    assert KVPool(BF16, 8).nbytes * 2 == KVPool(F32, 8).nbytes
    assert BF16.bytes_per_token * 2 == F32.bytes_per_token
    a, b = KVCacheManager(BF16, 64), KVCacheManager(F32, 64)
    assert a.pool.nbytes * 2 == b.pool.nbytes


def test_names():
    assert cache_dtype("auto", torch.float32) is torch.float32
    assert cache_dtype("bfloat16", torch.float32) is torch.bfloat16
    with pytest.raises(CtxlabError, match="unknown"):
        cache_dtype("fp8", torch.float32)


def test_on_the_model_prompt_logprobs_stay_close_to_a_float32_cache(loaded):
    """The real model, the same prompt, prefilled in chunks so the later chunks attend to
    bf16 K/V read back from the pool, then decoded: the prompt's log-probabilities move by a
    few hundredths of a nat at most, and the greedy continuation starts the same."""
    from ctxlab.engine import LLM, SamplingParams

    text = (
        "The history of the printing press begins in the fifteenth century, when movable "
        "type made books cheaper to produce and spread literacy across Europe. "
    ) * 6
    ids = loaded.tokenizer.encode(text)
    params = SamplingParams(max_tokens=8, prompt_logprobs=1)
    out = {}
    for name in ("auto", "bfloat16"):
        llm = LLM(loaded, kv_pool_tokens=2048, max_num_batched_tokens=32, kv_cache_dtype=name)
        out[name] = llm.generate([ids], params)[0]
    a = torch.tensor(out["auto"].prompt_logprobs[1:])
    b = torch.tensor(out["bfloat16"].prompt_logprobs[1:])
    diff = (a - b).abs()
    assert float(diff.max()) > 0  # bf16 K/V were read: the figures moved
    assert float(diff.mean()) < 0.02 and float(diff.max()) < 0.3
    assert out["auto"].token_ids[:4] == out["bfloat16"].token_ids[:4]
