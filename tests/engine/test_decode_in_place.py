"""Decode attention that reads long lanes in place equals the gathered lanes.

Unit: a manager allocates sequences the way the engine does (prompt chunks, then one block
per decode step, with other sequences freed in between so the free queue is scrambled);
`decode_attention` over their block tables gives the same output in place (views over runs
of adjacent blocks plus one gathered remainder) as gathered, bit for bit when one run covers
the lane. Engine: on the toy model with the in-place threshold lowered, batched chunked
greedy decoding equals the no-cache oracle, and the in-place path really ran.
"""

from __future__ import annotations

import random

import pytest
import torch
from engine_toy_model import CFG, ToyModel, one_torch_thread, oracle_greedy  # noqa: F401
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxlab.engine.lane_runs as lr
from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.engine.decode_attention import decode_attention
from ctxlab.engine.kernels import paged_decode
from ctxlab.kv import KVCacheManager, KVLayout, KVPool

BS = 4
LAYOUT = KVLayout(n_layers=2, n_kv_heads=3, head_dim=8, head_dim_v=8, block_size=BS)


@pytest.fixture(autouse=True)
def torch_path():
    """This file checks the torch path's in-place runs (the compiled kernel is checked
    against that path in test_paged_decode.py)."""
    paged_decode.set_enabled(False)
    yield
    paged_decode.set_enabled(None)


@pytest.fixture
def low_threshold(monkeypatch):
    monkeypatch.setattr(lr, "IN_PLACE_MIN_TOKENS", 8)
    monkeypatch.setattr(lr, "MIN_RUN_BLOCKS", 2)


def both(kv, table, n, q, layer):
    """(in place, gathered) decode attention of one layer; in place is None if not planned."""
    runs = lr.plan_runs(table, n, LAYOUT.n_layers, LAYOUT.n_kv_heads, BS)
    lanes = table[:, LAYOUT.lanes_of_layer(layer)]
    want, _ = decode_attention(q, kv.pool, lanes, length=n)
    if runs is None:
        return None, want
    got, _ = decode_attention(q, kv.pool, lanes, length=n, runs=runs[layer])
    return got, want


def grown(chunks: list[int], decode: int, seed: int) -> tuple[KVCacheManager, list]:
    """Sequences grown chunk by chunk and token by token, another one freed in between."""
    kv = KVCacheManager(LAYOUT, 1024, enable_prefix_caching=False)
    gen = torch.Generator().manual_seed(seed)
    kv.pool.data.copy_(torch.randn(kv.pool.data.shape, generator=gen))
    seqs, noise = [], []
    for _ in range(2):
        seq = kv.new_seq()
        for c in chunks:
            noise.append(kv.new_seq())
            assert kv.allocate(noise[-1], 3 * BS)
            assert kv.allocate(seq, seq.num_tokens + c)
            kv.advance(seq, c)
            if len(noise) % 2:
                kv.free(noise.pop(0))  # scrambles the free queue
        for _ in range(decode):
            assert kv.allocate(seq, seq.num_tokens + 1)
            kv.advance(seq, 1)
        seqs.append(seq)
    return kv, seqs


@settings(max_examples=30, deadline=None)
@given(
    chunks=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    decode=st.integers(0, 12),
    seed=st.integers(0, 1000),
)
def test_in_place_equals_gathered(chunks, decode, seed):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lr, "IN_PLACE_MIN_TOKENS", 8)
        mp.setattr(lr, "MIN_RUN_BLOCKS", 2)
        kv, seqs = grown(chunks, decode, seed)
        n = int(seqs[0].lane_len[0])
        nb = max(s.max_blocks for s in seqs)
        table = torch.zeros(2, LAYOUT.n_lanes, nb, dtype=torch.int64)
        for b, s in enumerate(seqs):
            table[b, :, : s.max_blocks] = s.table[:, : s.max_blocks]
        q = torch.randn(2, 3, 2, 8, generator=torch.Generator().manual_seed(seed))
        for layer in range(LAYOUT.n_layers):
            got, want = both(kv, table, n, q, layer)
            if got is not None:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_one_run_is_bit_exact_and_views_share_the_pool(low_threshold):
    kv = KVCacheManager(LAYOUT, 1024, enable_prefix_caching=False)
    kv.pool.data.normal_()
    seq = kv.new_seq()
    assert kv.allocate(seq, 40)  # one allocation: every lane one run of 10 blocks
    kv.advance(seq, 40)
    table = seq.table[:, :10][None]
    lanes = table[0, LAYOUT.lanes_of_layer(1)]
    k, v = kv.pool.gather(lanes)
    kk, vv = kv.pool.run_view(int(lanes[0, 0]), 10, 3, int(lanes[1, 0] - lanes[0, 0]))
    assert torch.equal(k, kk) and torch.equal(v, vv)
    assert kk.untyped_storage().data_ptr() == kv.pool.data.untyped_storage().data_ptr()
    got, want = both(kv, table, 40, torch.randn(1, 3, 2, 8), 1)
    assert got is not None and torch.equal(got, want)
    got, want = both(kv, table, 39, torch.randn(1, 3, 2, 8), 0)  # a partial last block
    assert got is not None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_engine_decodes_in_place_and_matches_the_oracle(low_threshold, monkeypatch):
    model = ToyModel()
    rng = random.Random(3)
    ps = [[rng.randrange(CFG.vocab_size) for _ in range(rng.randint(30, 90))] for _ in range(4)]
    expected = [oracle_greedy(model, p, 10) for p in ps]
    views = []
    real = KVPool.run_view

    def spy(self, *args):
        views.append(args)
        return real(self, *args)

    monkeypatch.setattr(KVPool, "run_view", spy)
    eng = LLMEngine(model, CFG, kv_pool_tokens=2048, block_size=BS, max_num_batched_tokens=37)
    rids = [eng.add_request(p, SamplingParams(max_tokens=10)) for p in ps]
    assert [o.token_ids for o in eng.run_all(rids)] == expected
    assert views, "the in-place path ran"
    # A quantized pool dequantizes on read: always gathered.
    views.clear()
    eng = LLMEngine(model, CFG, kv_pool_tokens=2048, block_size=BS, kv_format="int8")
    eng.run_all([eng.add_request(p, SamplingParams(max_tokens=3)) for p in ps])
    assert not views
