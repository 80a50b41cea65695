"""Requests that arrive together with one prefix compute it once (`filled_by_step`).

The first request's prefill writes the prefix's blocks; the others, admitted in the same step,
take those blocks as a prefix hit and compute only their own tails. Every layer writes the
whole step's K/V before any of its attention reads, so the answers are the no-cache oracle's.
"""

from __future__ import annotations

import random

import pytest
from engine_toy_model import CFG, ToyModel, one_torch_thread, oracle_greedy  # noqa: F401

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.engine.scheduler import ScheduledSeq

MODEL = ToyModel()
BS = 4
N_OUT = 6
rng = random.Random(3)
PREFIX = [rng.randrange(CFG.vocab_size) for _ in range(22)]  # 5 full blocks and 2 tokens
TAILS = [[rng.randrange(CFG.vocab_size) for _ in range(n)] for n in (5, 9, 3, 7)]
PROMPTS = [PREFIX + t for t in TAILS]


def engine(budget: int = 512, prefix_caching: bool = True) -> LLMEngine:
    return LLMEngine(
        MODEL,
        CFG,
        kv_pool_tokens=1024,
        block_size=BS,
        max_num_batched_tokens=budget,
        max_num_seqs=8,
        enable_prefix_caching=prefix_caching,
    )


def first_step(eng: LLMEngine, salts: list[str | None]) -> list[ScheduledSeq]:
    for p, salt in zip(PROMPTS, salts, strict=True):
        eng.add_request(p, SamplingParams(max_tokens=N_OUT), cache_salt=salt)
    return eng.scheduler.schedule()


def test_one_step_computes_the_shared_prefix_once():
    eng = engine()
    batch = first_step(eng, [None] * 4)
    shared = len(PREFIX) // BS * BS  # the full blocks of the prefix
    assert [s.num_new for s in batch] == [len(PROMPTS[0])] + [len(p) - shared for p in PROMPTS[1:]]
    held = [b.seq.kv.table[:, : shared // BS] for b in batch]
    assert all(bool((h == held[0]).all()) for h in held[1:])  # the same blocks, not copies
    assert eng.kv.alloc.num_cached_groups == 0  # nothing is findable before it is written


@pytest.mark.parametrize("budget", [512, 30, 18, 7])
def test_answers_are_the_oracle_s_and_the_pool_balances(budget):
    eng = engine(budget)
    params = SamplingParams(max_tokens=N_OUT)
    outs = eng.run_all([eng.add_request(p, params) for p in PROMPTS])
    assert [o.token_ids for o in outs] == [oracle_greedy(MODEL, p, N_OUT) for p in PROMPTS]
    if budget == 512:  # all four admitted in the first step: three hits on blocks in flight
        assert [o.metrics.reused_tokens for o in outs] == [0] + [len(PREFIX) // BS * BS] * 3
    eng.kv.alloc.check_invariants()
    assert eng.stats().blocks_used == 0


def test_a_chunk_shares_the_block_it_completes():
    """The first prompt's second chunk completes the prefix's last full block: the second
    prompt, admitted in that step, takes the four committed blocks and that one."""
    eng = engine(budget=18)
    first_step(eng, [None] * 4)
    eng.step()  # the first prompt's first 18 tokens: blocks 0-3 full and committed
    assert eng.kv.alloc.num_cached_groups == 4
    batch = eng.scheduler.schedule()
    assert [s.num_new for s in batch] == [9, 9]
    a, b = batch[0].seq.kv, batch[1].seq.kv
    assert batch[1].seq.metrics.reused_tokens == 20
    assert bool((b.table[:, :5] == a.table[:, :5]).all())


def test_tenants_do_not_share_blocks_in_flight():
    eng = engine()
    batch = first_step(eng, ["a", "b", "a", None])
    assert [s.seq.metrics.reused_tokens for s in batch] == [0, 0, 20, 0]
