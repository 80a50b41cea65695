"""Prefix caching with sliding-window layers (toy model, windows (5, None), pages of 4).

A cached prefix is reused only while every sliding lane still has its last window: the
sliding lane's older blocks may leave their groups (handed out again) without evicting
the group, a hit is cut back to the longest prefix whose last window is complete, and a
later run of the same prompt fills the missing blocks back in. Tenant salt and eviction
behave as on the full-attention model.
"""

from __future__ import annotations

import random

import pytest
from engine_toy_model import CFG, ToyModel, one_torch_thread, oracle_greedy  # noqa: F401
from test_engine_windows import MODEL, WCFG, oracle

from ctxlab.engine import LLMEngine, SamplingParams

rng = random.Random(5)
PROMPT = [rng.randrange(CFG.vocab_size) for _ in range(40)]  # 8 windows long
FULL_MODEL = ToyModel(seed=1)


def engine(windowed: bool = True, **kw) -> LLMEngine:
    args = dict(kv_pool_tokens=512, block_size=4, max_num_batched_tokens=16, max_num_seqs=8)
    args.update(kw)
    return LLMEngine(MODEL if windowed else FULL_MODEL, WCFG if windowed else CFG, **args)


def answer(windowed: bool, prompt: list[int], n: int) -> list[int]:
    return oracle(prompt, n) if windowed else oracle_greedy(FULL_MODEL, prompt, n)


def run(eng: LLMEngine, prompt: list[int], n: int = 6, salt: str | None = None):
    rid = eng.add_request(prompt, SamplingParams(max_tokens=n), cache_salt=salt)
    out = eng.run_all([rid])[0]
    return out.metrics.reused_tokens, out.token_ids


def test_a_repeated_long_prompt_is_served_from_the_cache_and_stays_right():
    eng = engine()
    expected = oracle(PROMPT, 6)
    assert run(eng, PROMPT) == (0, expected)
    assert run(eng, PROMPT) == (36, expected)  # every full block but the last token's
    assert eng.stats().blocks_slid > 0


def test_a_hit_needs_the_last_window_and_a_cold_run_fills_it_back():
    eng = engine(max_num_batched_tokens=64)
    kv, alloc = eng.kv, eng.kv.alloc
    final: set[int] = set()  # what the first run holds to its end (its last window)
    free = kv.free
    kv.free = lambda seq: (final.update(seq.held_blocks()), free(seq))[1]
    run(eng, PROMPT, 1)
    kv.free = free
    # Another tenant's work takes every free block but those: the sliding lanes' older
    # blocks leave their groups, the groups stay (their full-attention blocks are intact).
    taken = alloc.allocate(alloc.num_free - len(final))
    assert not final & set(taken)
    alloc.decref(taken)
    st = eng.stats()
    assert st.cached_blocks_detached > 0 and st.cached_blocks_evicted == 0
    alloc.check_invariants()
    # A prompt that continues the first at its end finds the window there: 40 reused.
    longer = [*PROMPT, 1, 2, 3]
    assert run(eng, longer) == (40, oracle(longer, 6))
    # The same prompt again would stop at 36, whose window is gone: it is computed cold,
    # and its blocks fill the groups back in, so a third run hits again.
    assert run(eng, PROMPT) == (0, oracle(PROMPT, 6))
    assert run(eng, PROMPT) == (36, oracle(PROMPT, 6))
    alloc.check_invariants()
    assert kv.stats().blocks_used == 0


@pytest.mark.parametrize("windowed", [False, True], ids=["full", "windowed"])
def test_tenant_salt_isolates_as_on_full_attention(windowed):
    eng = engine(windowed)
    want = answer(windowed, PROMPT, 6)
    assert run(eng, PROMPT, salt="a") == (0, want)
    assert run(eng, PROMPT, salt="b") == (0, want)
    assert run(eng, PROMPT) == (0, want)
    assert run(eng, PROMPT, salt="a") == (36, want)
    assert run(eng, PROMPT, salt="b") == (36, want)


@pytest.mark.parametrize("windowed", [False, True], ids=["full", "windowed"])
def test_eviction_as_on_full_attention(windowed):
    """Other requests that cycle through the whole pool evict the cached prefix; the
    prompt is then recomputed, and answered the same."""
    eng = engine(windowed, kv_pool_tokens=64, max_num_batched_tokens=64)
    want = answer(windowed, PROMPT, 6)
    assert run(eng, PROMPT) == (0, want)
    fillers = [[rng.randrange(CFG.vocab_size) for _ in range(50)] for _ in range(3)]
    rids = [eng.add_request(p, SamplingParams(max_tokens=2)) for p in fillers]
    eng.run_all(rids)
    assert eng.stats().cached_blocks_evicted > 0
    reused, tokens = run(eng, PROMPT)
    assert tokens == want
    assert reused == 0
