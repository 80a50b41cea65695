"""`quant` inside the engine: the pool itself stores int8 / KIVI codes, under any policy.

Toy model (fast): every policy kind (full retention, eviction by attention, cache-slot
streaming, Quest selection, recall) runs over a quantized pool at batch > 1 with chunked
prefill and prefix caching; at every step the resident bytes measured from the pool are
exactly blocks held x bytes per quantized block plus one full-precision residual block per
lane whose last block is partial, eviction stays within its budget, prefix-cached blocks
never change, and everything (blocks and residual buffers) comes back at the end.

Default model (marked `model`): int8 and kivi4 pools give the same greedy text as the
float pool on a 385-token prompt, and kivi4 composed with snapkv keeps its byte budget.
"""

from __future__ import annotations

import random
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from engine_toy_model import CFG, ToyModel, one_torch_thread  # noqa: F401  (fixture)

from ctxlab.engine import LLM, LLMEngine, SamplingParams
from ctxlab.engine.policy_runtime import NullRuntime
from ctxlab.errors import CtxlabError
from ctxlab.kv.quantize import kv_bytes
from ctxlab.policy import make_policy

# a 4-bit code boundary can move with the kernel that computed the key
pytestmark = pytest.mark.isa

MODEL = ToyModel(with_rope=True)
BS = 4


def prompts(n: int, seed: int, lo: int = 40, hi: int = 110) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(CFG.vocab_size) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def engine(**kw) -> LLMEngine:
    args = dict(kv_pool_tokens=2048, block_size=BS, max_num_batched_tokens=29, max_num_seqs=8)
    args.update(kw)
    return LLMEngine(MODEL, CFG, **args)


def measured_identity(eng: LLMEngine, kv) -> int:
    """What the resident bytes of one sequence must be, from its block table alone."""
    pool = eng.kv.pool
    partial = int((kv.lane_len % BS != 0).sum()) if pool.fmt != "int8" else 0
    return int(kv.n_blocks.sum()) * pool.block_bytes + partial * pool.residual_block_bytes


CASES = {
    "quant-kivi4": ("quant", None, {}, None),
    "full-int8": (None, None, {}, "int8"),
    "snapkv-kivi4": ("snapkv", 32, {"obs_window": 8, "rerun_every": 1}, "kivi4"),
    "h2o-int8": ("h2o", 32, {}, "int8"),
    "streaming-kivi2": ("streaming", 32, {}, "kivi2"),
    "quest-kivi4": ("quest", 16, {}, "kivi4"),
    "recall-int8": ("recall", 48, {"recall_blocks": 2, "block": 4, "base": "h2o"}, "int8"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_quantized_pool_bytes_budget_and_prefix_cache_under_every_policy(case):
    name, budget, params, fmt = CASES[case]
    policy = make_policy(name, budget, **params) if params else name
    eng = engine(policy=policy, budget=None if params else budget, kv_format=fmt)
    pool, lay, alloc = eng.kv.pool, eng.kv.layout, eng.kv.alloc
    assert pool.quantized and pool.block_bytes < lay.bytes_per_block
    shared = prompts(1, seed=9, lo=48, hi=48)[0]
    ps = [shared + p for p in prompts(3, seed=3, lo=5, hi=60)] + prompts(2, seed=4)
    first = eng.add_request([*shared, 1, 2, 3], SamplingParams(max_tokens=2))
    eng.run_all([first])
    cached = {h: (g, pool.gather(torch.tensor(g)[:, None])) for h, g in alloc.cached.items()}
    assert cached
    rids = [eng.add_request(p, SamplingParams(max_tokens=10)) for p in ps]
    evicts = name in ("snapkv", "h2o", "streaming", "recall")
    keep = {"recall": 48 - 2 * 4}.get(name, budget)
    bound = lay.n_lanes * ((-(-(keep or 0) // BS) + 1) * pool.block_bytes)
    bound += lay.n_lanes * pool.residual_block_bytes
    checked = 0
    while eng.has_unfinished():
        eng.step()
        used = {b for b in range(pool.num_blocks) if alloc.ref[b] > 0}
        pool.check_invariants(used)
        for h, (g, before) in cached.items():
            if alloc.cached.get(h) == g:
                after = pool.gather(torch.tensor(g)[:, None])
                assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
                checked += 1
        for rid in rids:
            s = eng.seqs[rid]
            if s.finished:
                continue
            got = eng.kv.resident_bytes(s.kv)
            assert got == measured_identity(eng, s.kv)
            st = getattr(eng.runtime, "states", {}).get(rid)
            if evicts and st is not None and st.prefilled:
                assert got <= bound
    outs = [eng.output(r) for r in rids]
    assert all(len(o.token_ids) == 10 for o in outs)
    assert eng.stats().prefix_cache_hits > 0 and checked > 0
    assert eng.stats().blocks_used == 0 and pool.residual_blocks == 0


def test_quantized_pool_survives_preemption_by_recompute():
    pol = make_policy("snapkv", 40, obs_window=8)
    eng = engine(policy=pol, kv_format="kivi4", kv_pool_tokens=192, max_num_batched_tokens=64)
    rids = [eng.add_request(p, SamplingParams(max_tokens=60)) for p in prompts(4, seed=21)]
    while eng.has_unfinished():
        eng.step()
        eng.kv.pool.check_invariants({b for b, r in enumerate(eng.kv.alloc.ref) if r > 0})
    assert eng.scheduler.num_preemptions > 0
    assert all(len(eng.output(r).token_ids) == 60 for r in rids)
    assert eng.stats().blocks_used == 0 and eng.kv.pool.residual_blocks == 0


def test_quant_api_errors_are_one_sentence():
    with pytest.raises(CtxlabError, match="keeps every token"):
        engine(policy="quant", budget=32)
    with pytest.raises(CtxlabError, match="unknown"):
        engine(kv_format="int4")
    with pytest.raises(CtxlabError, match="give one of them"):
        engine(policy=make_policy("quant", fmt="int8"), kv_format="kivi2")
    eng = engine(policy="quant", kv_format="int8")
    assert eng.policy.fmt == "int8" and eng.kv.pool.fmt == "int8"
    assert type(eng.runtime) is NullRuntime  # a storage format alone drives nothing


# -- the default model ---------------------------------------------------------------------
def short_prompt(tok) -> list[int]:
    """The first 1,200 characters of the bundled tinyshakespeare.txt and a question about
    them, in the chat template: 385 tokens."""
    text = resources.files("ctxlab").joinpath("data/tinyshakespeare.txt").read_text()[:1200]
    q = "Who speaks first in the text above, and what do they say?"
    return tok.apply_chat([{"role": "user", "content": text + "\n\n" + q}])


def generate(loaded, ids, n=24, **kw):
    llm = LLM(loaded, kv_pool_tokens=1024, max_num_batched_tokens=512, **kw)
    return llm.generate([ids], SamplingParams(max_tokens=n))[0], llm.engine.kv


@pytest.mark.model
def test_int8_and_kivi4_pools_give_the_float_pool_greedy_text(loaded):
    ids = short_prompt(loaded.tokenizer)
    assert len(ids) == 385
    full, fkv = generate(loaded, ids)
    int8, _ = generate(loaded, ids, kv_format="int8")
    kivi4, kkv = generate(loaded, ids, policy="quant")  # quant alone: kivi4, every token
    assert int8.token_ids == full.token_ids, (int8.text, full.text)
    assert kivi4.token_ids == full.token_ids, (kivi4.text, full.text)
    assert "First Citizen" in full.text
    # Every token kept: 408 cached tokens = 25 full blocks + 8 tokens per lane.
    lanes, n = fkv.n_lanes, 385 + 24 - 1
    assert full.metrics.resident_kv_bytes == lanes * 26 * fkv.layout.bytes_per_block
    assert int8.metrics.resident_kv_bytes == lanes * kv_bytes(26 * 16, 64, 64, "int8")
    kp = kkv.pool
    assert kivi4.metrics.resident_kv_bytes == lanes * (
        kv_bytes(n // 16 * 16, 64, 64, "kivi4", 16, 4, 32)
        + kp.block_bytes
        + kp.residual_block_bytes
    )
    assert kivi4.metrics.resident_kv_bytes < 0.3 * full.metrics.resident_kv_bytes


@pytest.mark.model
def test_kivi4_with_snapkv_keeps_its_byte_budget(loaded):
    ids = short_prompt(loaded.tokenizer)
    snap, _ = generate(loaded, ids, policy="snapkv", budget=128)
    both, kv = generate(loaded, ids, policy="snapkv", budget=128, kv_format="kivi4")
    assert "First Citizen" in both.text, both.text
    pool, lanes = kv.pool, kv.n_lanes
    # SnapKV cuts each lane to 128 tokens at the prompt's end; 23 decode tokens follow.
    n = 128 + 23
    exact = lanes * (-(-n // 16) * pool.block_bytes + pool.residual_block_bytes)
    assert both.metrics.resident_kv_bytes == exact
    budget = lanes * (kv_bytes(n, 64, 64, "kivi4", 16, 4, 32) + pool.block_bytes)
    assert both.metrics.resident_kv_bytes <= budget + lanes * pool.residual_block_bytes
    assert both.metrics.resident_kv_bytes < 0.35 * snap.metrics.resident_kv_bytes
