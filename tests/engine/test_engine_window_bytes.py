"""Resident KV bytes of a windowed model equal the planner's page-rounded figure.

The planner (`ctxlab.plan.paging`) says a request of n tokens holds ceil(n/P) pages per full
layer and, per sliding layer, the pages covering positions [n - W, n). The engine holds
exactly that once the request's tokens are in the pool, at the engine's cache dtype (the
toy model's float64 here), at every length, chunked or not.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from engine_toy_model import CFG, one_torch_thread  # noqa: F401  (fixture)
from test_engine_windows import MODEL, WCFG, WINDOWS

from ctxlab.arch.spec import ArchSpec, LayerSpec
from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.plan.paging import paged_request

BS = 4


def toy_arch() -> ArchSpec:
    layers = tuple(
        LayerSpec(
            "full" if w is None else "sliding",
            kv_heads=CFG.num_kv_heads,
            d_k=CFG.head_dim,
            d_v=CFG.head_dim,
            window=w,
        )
        for w in WINDOWS
    )
    return ArchSpec(
        "toy",
        layers,
        CFG.num_heads,
        CFG.hidden,
        params=1,
        cache_dtype_bytes=8,  # float64
    )


@pytest.mark.parametrize("chunk", [512, 3])
def test_resident_bytes_equal_the_planner_at_every_length(chunk):
    eng = LLMEngine(MODEL, WCFG, kv_pool_tokens=256, block_size=BS, max_num_batched_tokens=chunk)
    arch = toy_arch()
    rng = random.Random(chunk)
    for n in range(1, 41):
        prompt = [rng.randrange(CFG.vocab_size) for _ in range(n)]
        # One sampled token is never written: the request finishes holding its n tokens.
        out = eng.run_all([eng.add_request(prompt, SamplingParams(max_tokens=1))])[0]
        planned = paged_request(arch, n, BS).allocated_bytes
        assert out.metrics.resident_kv_bytes == planned, n
    # Past the window that is less than full attention would hold (so the test tells a
    # sliding lane that keeps everything from one that lets go).
    full = replace(arch, layers=(arch.layers[1],) * 2)
    assert paged_request(arch, 40, BS).allocated_bytes < paged_request(full, 40, BS).allocated_bytes
