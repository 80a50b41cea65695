"""Engine behaviour on a tiny random model against a no-cache greedy oracle."""

from __future__ import annotations

import random

import pytest
import torch
from engine_toy_model import CFG, ToyModel, one_torch_thread, oracle_greedy  # noqa: F401

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.errors import CtxlabError

MODEL = ToyModel()
N_OUT = 12


def prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 70) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(CFG.vocab_size) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


PROMPTS = prompts(6)
EXPECTED = [oracle_greedy(MODEL, p, N_OUT) for p in PROMPTS]


def engine(**kw) -> LLMEngine:
    args = dict(kv_pool_tokens=4096, block_size=4, max_num_batched_tokens=512, max_num_seqs=16)
    args.update(kw)
    return LLMEngine(MODEL, CFG, **args)


def run(eng: LLMEngine, ps, n=N_OUT, **kw):
    params = SamplingParams(max_tokens=n, **kw)
    rids = [eng.add_request(p, params) for p in ps]
    return eng.run_all(rids)


def test_oracle_is_not_trivial():
    assert len({tuple(e) for e in EXPECTED}) == len(EXPECTED)


@pytest.mark.parametrize("budget", [512, 7, 1])
def test_batched_and_chunked_greedy_matches_oracle(budget):
    eng = engine(max_num_batched_tokens=budget)
    outs = run(eng, PROMPTS)
    assert [o.token_ids for o in outs] == EXPECTED
    assert all(o.finish_reason == "length" for o in outs)
    assert eng.stats().blocks_used == 0


def test_one_at_a_time_matches_oracle():
    eng = engine()
    for p, e in zip(PROMPTS, EXPECTED, strict=True):
        assert run(eng, [p])[0].token_ids == e


def test_prefix_cache_reuse_and_same_output():
    eng = engine()
    base = PROMPTS[5]
    first = run(eng, [base])[0]
    again = run(eng, [base])[0]
    assert again.token_ids == first.token_ids
    assert again.metrics.reused_tokens == (len(base) - 1) // 4 * 4
    # A prompt sharing the first 9 tokens reuses exactly the 2 full blocks before position 9.
    other = [*base[:9], (base[9] + 1) % CFG.vocab_size, *base[10:]]
    out = run(eng, [other])[0]
    assert out.metrics.reused_tokens == 8
    assert out.token_ids == oracle_greedy(MODEL, other, N_OUT)
    # Decode-produced blocks are cached too: prompt + output re-sent hits beyond the prompt.
    cont = base + first.token_ids
    assert run(eng, [cont])[0].metrics.reused_tokens == (len(cont) - 1) // 4 * 4


def test_pool_pressure_preempts_and_still_answers_right():
    eng = engine(kv_pool_tokens=96, max_num_batched_tokens=64)
    outs = run(eng, PROMPTS)
    assert [o.token_ids for o in outs] == EXPECTED
    assert sum(o.metrics.preemptions for o in outs) > 0
    assert eng.scheduler.num_preemptions == sum(o.metrics.preemptions for o in outs)
    assert eng.stats().blocks_used == 0


def test_pool_pressure_without_prefix_cache():
    eng = engine(kv_pool_tokens=96, max_num_batched_tokens=16, enable_prefix_caching=False)
    outs = run(eng, PROMPTS)
    assert [o.token_ids for o in outs] == EXPECTED
    assert eng.scheduler.num_preemptions > 0


def test_compacted_lane_is_read_with_its_own_length():
    """A lane compacted to all its slots (same tokens, fresh blocks) reads the same."""
    eng = engine(max_num_batched_tokens=512)
    p = PROMPTS[1]
    rid = eng.add_request(p, SamplingParams(max_tokens=N_OUT))
    eng.step()  # prefill
    seq = eng.seqs[rid]
    for lane in range(eng.kv.n_lanes):
        eng.kv.compact_lane(seq.kv, lane, torch.arange(int(seq.kv.lane_len[lane])))
    assert not seq.kv.lockstep
    out = eng.run_all([rid])[0]
    assert out.token_ids == EXPECTED[1]


def test_sampling_is_seeded_and_batch_independent():
    a = run(engine(), PROMPTS[:3], temperature=0.8, top_p=0.9, top_k=20, seed=7)
    b = run(engine(), PROMPTS[:1], temperature=0.8, top_p=0.9, top_k=20, seed=7)
    assert a[0].token_ids == b[0].token_ids
    c = run(engine(), PROMPTS[:1], temperature=0.8, seed=8)
    assert c[0].token_ids != a[0].token_ids


def test_metrics_are_consistent():
    out = run(engine(), PROMPTS[:2])[0]
    m = out.metrics
    assert m.output_tokens == N_OUT == len(m.token_times)
    assert len(m.itl) == N_OUT - 1
    assert m.ttft > 0 and m.latency >= m.ttft
    assert m.tpot == pytest.approx((m.latency - m.ttft) / (N_OUT - 1))
    assert m.resident_kv_bytes > 0


@pytest.mark.parametrize(
    ("kw", "prompt", "pool", "msg"),
    [
        ({}, [], 4096, "empty"),
        ({}, [1] * 600, 8192, "maximum"),
        ({"max_tokens": 0}, [1], 4096, "max_tokens"),
        ({"top_p": 0.0}, [1], 4096, "top_p"),
        ({"top_p": 1.5}, [1], 4096, "top_p"),
        ({"max_tokens": 20}, [1] * 40, 32, "pool"),
    ],
)
def test_bad_input_is_one_sentence(kw, prompt, pool, msg):
    with pytest.raises(CtxlabError, match=msg) as err:
        eng = engine(kv_pool_tokens=pool)
        eng.add_request(prompt, SamplingParams(**{"max_tokens": 4, **kw}))
    text = str(err.value)
    assert text.endswith(".") and text.count(". ") == 0
