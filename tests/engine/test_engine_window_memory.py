"""Sliding-window layers free memory for real (toy model, windows (5, None), pages of 4).

A sliding lane holds at most `KVLayout.window_blocks(W)` blocks between steps (the window
rounded up to whole pages, plus one page of slack), whatever it decodes; what it hands back
is free in the pool, other requests run in it, and admission counts the window bound.
"""

from __future__ import annotations

import random

import pytest
from engine_toy_model import CFG, ToyModel, one_torch_thread  # noqa: F401  (fixture)
from test_engine_windows import MODEL, WCFG, WINDOWS, oracle

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.errors import CtxlabError

rng = random.Random(11)
LONG = [rng.randrange(CFG.vocab_size) for _ in range(30)]
SLIDING = [0, 1]  # layer 0's two KV heads
FULL = [2, 3]


def engine(cfg=WCFG, model=MODEL, **kw) -> LLMEngine:
    args = dict(kv_pool_tokens=2048, block_size=4, max_num_batched_tokens=8, max_num_seqs=8)
    args.update(kw)
    return LLMEngine(model, cfg, **args)


def test_sliding_lanes_stay_within_the_window_while_decoding():
    eng = engine()
    bound = eng.kv.layout.window_blocks(WINDOWS[0])
    assert bound == 3  # ceil(5 / 4) + 1
    rid = eng.add_request(LONG, SamplingParams(max_tokens=40))  # 8 windows past the prompt
    seq = eng.seqs[rid]
    steps = 0
    while eng.has_unfinished():
        eng.step()
        if seq.finished:
            break
        steps += 1
        held = seq.kv.held
        assert int(held[SLIDING].max()) <= bound
        # full lanes keep every token
        assert held[FULL].tolist() == [-(-seq.kv.num_tokens // 4)] * 2
        # what was handed back is free in the pool: only this request holds blocks
        st = eng.stats()
        assert st.blocks_used == int(held.sum())
        assert st.blocks_used + st.blocks_free == st.blocks_total
    assert steps > 40
    assert eng.stats().blocks_slid > 2 * 15  # both sliding lanes let go of ~17 blocks each
    assert eng.output(rid).token_ids == oracle(LONG, 40)
    assert eng.stats().blocks_used == 0


def _two_requests(eng: LLMEngine) -> list[list[int]]:
    a = [rng.randrange(CFG.vocab_size) for _ in range(20)]
    b = [rng.randrange(CFG.vocab_size) for _ in range(20)]
    params = SamplingParams(max_tokens=28)
    rids = [eng.add_request(p, params) for p in (a, b)]
    outs = [o.token_ids for o in eng.run_all(rids)]
    return [a, b, *outs]


def test_freed_blocks_serve_another_request():
    """Two 48-token requests in a pool of 80 blocks: on full attention they need 96 and
    one is preempted; with a sliding layer they run side by side in blocks it handed back."""
    full = engine(cfg=CFG, model=ToyModel(seed=1), kv_pool_tokens=80)
    _two_requests(full)
    assert full.num_preemptions > 0
    win = engine(kv_pool_tokens=80)
    a, b, out_a, out_b = _two_requests(win)
    assert win.num_preemptions == 0
    assert win.stats().blocks_slid > 0
    assert [out_a, out_b] == [oracle(a, 28), oracle(b, 28)]


def test_admission_counts_the_window_bound():
    """70 tokens per request in a pool of 48 tokens per lane: refused on full attention,
    admitted (and right) when half the lanes keep only their window."""
    prompt = [rng.randrange(CFG.vocab_size) for _ in range(40)]
    full = engine(cfg=CFG, model=ToyModel(seed=1), kv_pool_tokens=48)
    with pytest.raises(CtxlabError, match="enlarge kv_pool_tokens"):
        full.add_request(prompt, SamplingParams(max_tokens=30))
    win = engine(kv_pool_tokens=48)
    rid = win.add_request(prompt, SamplingParams(max_tokens=30))
    assert win.run_all([rid])[0].token_ids == oracle(prompt, 30)
    assert win.num_preemptions == 0
    with pytest.raises(CtxlabError, match="enlarge kv_pool_tokens"):
        win.add_request(prompt, SamplingParams(max_tokens=60))  # full lanes: 25 blocks each
