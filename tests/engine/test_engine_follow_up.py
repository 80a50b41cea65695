"""A held request's next turn runs on the cache it kept (`hold`, `follow_up`, `release`)."""

from __future__ import annotations

import random

import pytest
from engine_toy_model import CFG, ToyModel, one_torch_thread, oracle_greedy  # noqa: F401

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.errors import CtxlabError
from ctxlab.policy import make_policy

MODEL = ToyModel()


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(CFG.vocab_size) for _ in range(n)]


def engine(**kw) -> LLMEngine:
    args = dict(kv_pool_tokens=2048, block_size=4, max_num_batched_tokens=512, max_num_seqs=8)
    args.update(kw)
    return LLMEngine(MODEL, CFG, **args)


def turn(eng: LLMEngine, rid: int, new: list[int], n: int):
    eng.follow_up(rid, new, SamplingParams(max_tokens=n, ignore_eos=True))
    (out,) = eng.run_all([rid])
    return out


def test_full_cache_follow_up_equals_the_whole_conversation_as_one_prompt() -> None:
    eng = engine()
    first, second = ids(40, 1), ids(9, 2)
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    rid = eng.add_request(first, params, hold=True)
    (out1,) = eng.run_all([rid])
    held = eng.kv.resident_bytes(eng.seqs[rid].kv)
    assert held > 0 and rid in eng.seqs  # the cache stays after the request ended
    out2 = turn(eng, rid, second, 6)
    whole = first + out1.token_ids + second
    assert out2.token_ids == oracle_greedy(MODEL, whole, 6)
    assert out2.prompt_token_ids == whole
    # nothing cached was computed again: the turn reused every token but the last answer's
    assert out2.metrics.reused_tokens == len(first) + len(out1.token_ids) - 1
    assert out2.metrics.ttft > 0 and out2.metrics.output_tokens == 6
    eng.release(rid)
    assert rid not in eng.seqs and eng.kv.alloc.num_used == 0


def test_a_compressed_cache_stays_compressed_for_the_next_turn() -> None:
    policy = make_policy("window", 16)
    eng = engine(policy=policy)
    first, second = ids(60, 3), ids(8, 4)
    rid = eng.add_request(first, SamplingParams(max_tokens=3, ignore_eos=True), hold=True)
    (out1,) = eng.run_all([rid])
    kv = eng.seqs[rid].kv
    assert int(kv.lane_len.max()) < len(first)  # evicted at the prompt's end
    out2 = turn(eng, rid, second, 4)
    # the same cache went on: not a fresh prefill of the whole conversation, which the
    # window policy would cut to the same size but from the full text (other tokens kept)
    fresh = engine(policy=make_policy("window", 16))
    rid2 = fresh.add_request(
        first + out1.token_ids + second, SamplingParams(max_tokens=4, ignore_eos=True)
    )
    (again,) = fresh.run_all([rid2])
    assert out2.metrics.reused_tokens == len(first) + len(out1.token_ids) - 1
    assert again.metrics.reused_tokens == 0
    assert int(eng.seqs[rid].kv.lane_len.max()) <= 16 + 4  # budget + one block's slack
    full = engine()
    held = full.add_request(first, SamplingParams(max_tokens=3, ignore_eos=True), hold=True)
    full.run_all([held])
    turn(full, held, second, 4)
    small = eng.kv.resident_bytes(eng.seqs[rid].kv)
    assert 0 < small < full.kv.resident_bytes(full.seqs[held].kv) / 2
    eng.release(rid)
    assert eng.kv.alloc.num_used == 0


def test_follow_up_needs_a_held_request_that_ended() -> None:
    eng = engine()
    rid = eng.add_request(ids(10, 5), SamplingParams(max_tokens=2, ignore_eos=True))
    eng.run_all([rid])
    with pytest.raises(CtxlabError, match="holds no cache"):
        eng.follow_up(rid, ids(3, 6))
    held = eng.add_request(ids(10, 7), SamplingParams(max_tokens=2, ignore_eos=True), hold=True)
    with pytest.raises(CtxlabError, match="holds no cache"):
        eng.follow_up(held, ids(3, 6))  # still waiting: not finished
    eng.run_all([held])
    with pytest.raises(CtxlabError, match="chat template"):
        eng.follow_up(held, [{"role": "user", "content": "hi"}])  # type: ignore[arg-type]
    eng.release(held)
    eng.release(held)  # twice is harmless
    assert eng.kv.alloc.num_used == 0


def test_set_policy_reuses_the_prefix_cache_and_cuts_as_a_fresh_engine_would() -> None:
    prompt = ids(90, 8)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    eng = engine()
    eng.run_all([eng.add_request(prompt, params)])  # full cache: fills the prefix cache
    eng.set_policy("snapkv", 40)
    rid = eng.add_request(prompt, params, hold=True)
    (out,) = eng.run_all([rid])
    assert out.metrics.reused_tokens > 0  # the prefill came from the prefix cache
    assert int(eng.seqs[rid].kv.lane_len.max()) < len(prompt)  # and the new policy cut it
    alone = engine(policy=make_policy("snapkv", 40))
    (ref,) = alone.run_all([alone.add_request(prompt, params)])
    assert out.token_ids == ref.token_ids
    with pytest.raises(CtxlabError, match="held"):
        eng.set_policy(None)  # a held request's state belongs to the old policy
    eng.release(rid)
    eng.set_policy(None)
    with pytest.raises(CtxlabError, match="pool stores"):
        eng.set_policy("quant")  # another storage format needs another pool
