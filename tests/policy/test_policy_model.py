"""Policies on the default model (SmolLM2-135M-Instruct), greedy.

The needle prompt (stated here so the test can be read on its own): the first 5,200
characters of the bundled tinyshakespeare.txt, with the sentence " The secret word is
tangerine. " inserted after its first line break that precedes character 200 (so the needle
sits in the first ~50 tokens), then a blank line and "What is the secret word mentioned in
the text above?", wrapped in the model's chat template: 1,519 tokens.
"""

from __future__ import annotations

from importlib import resources

import pytest
import torch

from ctxlab.engine import LLM, LLMEngine, SamplingParams

# `isa` (rerun by tests/second_isa.py) marks the parity test below: greedy text compares two
# paths, which a float kernel can move. The needle tests are outcomes of which tokens a policy
# keeps; what a lower instruction set can change there (near ties at the cut) is pinned
# exactly, per policy, by the golden records (tests/policy/test_golden.py, rerun there), so
# they run once. The streaming test pins sizes, positions and step counts only.
pytestmark = pytest.mark.model


@pytest.fixture(scope="module", autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(min(2, before))
    yield
    torch.set_num_threads(before)


def shakespeare() -> str:
    return resources.files("ctxlab").joinpath("data/tinyshakespeare.txt").read_text()


def needle_prompt(tok) -> list[int]:
    hay = shakespeare()[:5200]
    cut = hay.rfind("\n", 0, 200) + 1
    body = hay[:cut] + " The secret word is tangerine. " + hay[cut:]
    q = "What is the secret word mentioned in the text above?"
    return tok.apply_chat([{"role": "user", "content": body + "\n\n" + q}])


def answer(loaded, ids, policy=None, budget=None, n=24):
    llm = LLM(loaded, kv_pool_tokens=4096, max_num_batched_tokens=512, policy=policy, budget=budget)
    out = llm.generate([ids], SamplingParams(max_tokens=n))[0]
    return out


def test_snapkv_keeps_the_needle_window_loses_it(loaded):
    ids = needle_prompt(loaded.tokenizer)
    assert 1400 <= len(ids) <= 1600
    full = answer(loaded, ids)
    assert "tangerine" in full.text.lower(), full.text
    snap = answer(loaded, ids, "snapkv", 384)
    assert "tangerine" in snap.text.lower(), snap.text
    win = answer(loaded, ids, "window", 384)
    assert "tangerine" not in win.text.lower(), win.text
    # What each kept, measured from the pool when it finished (bytes of blocks held).
    bpt = loaded.config.num_layers * loaded.config.num_kv_heads * 2 * 64 * 4
    assert full.metrics.resident_kv_bytes >= len(ids) * bpt
    assert win.metrics.resident_kv_bytes <= (384 + 16) * bpt
    assert snap.metrics.resident_kv_bytes <= (384 + 24 + 16) * bpt  # prompt cut, decode grows


def test_recall_brings_back_the_needle_h2o_evicted(loaded):
    ids = needle_prompt(loaded.tokenizer)
    h2o = answer(loaded, ids, "h2o", 384, n=16)
    assert "tangerine" not in h2o.text.lower(), h2o.text
    llm = LLM(
        loaded, kv_pool_tokens=4096, max_num_batched_tokens=512, policy="recall", budget=384
    )  # h2o on 384 - 8 x 8 tokens, plus 8 recalled blocks of 8 tokens
    out = llm.generate([ids], SamplingParams(max_tokens=16))[0]
    assert "tangerine" in out.text.lower(), out.text
    tier = llm.engine.runtime.far.tier
    assert tier.bytes_in > 0 and tier.recalls > 0 and tier.hits > 0
    assert tier.bytes_out >= (len(ids) - 384) * 30 * 3 * 128 * 4  # every evicted token left
    lay = llm.engine.kv.layout
    assert out.metrics.resident_kv_bytes <= lay.n_lanes * (320 // 16 + 1) * lay.bytes_per_block


@pytest.mark.isa
def test_full_policy_equals_engine_greedy(loaded):
    ids = loaded.tokenizer.apply_chat([{"role": "user", "content": "Name three colors."}])
    plain = answer(loaded, ids, n=16)
    assert answer(loaded, ids, "full", n=16).token_ids == plain.token_ids


def test_streaming_cache_slot_runs_past_the_trained_length(loaded):
    cfg = loaded.config
    assert cfg.max_position == 8192
    tok = loaded.tokenizer
    text = shakespeare()
    ids = tok.encode(text[:60_000])[:9000]
    assert len(ids) == 9000
    budget, chunk, bs = 256, 1024, 16
    eng = LLMEngine(
        loaded.model,
        cfg,
        tok,
        kv_pool_tokens=2048,
        block_size=bs,
        max_num_batched_tokens=chunk,
        policy="streaming",
        budget=budget,
    )
    rid = eng.add_request(ids, SamplingParams(max_tokens=64, ignore_eos=True))
    lay = eng.kv.layout
    bound = lay.n_lanes * (budget // bs + 1) * lay.bytes_per_block
    steps = 0
    while eng.has_unfinished():
        eng.step()
        seq = eng.seqs[rid]
        if seq.finished:
            break
        steps += 1
        assert eng.kv.resident_bytes(seq.kv) <= bound
        # The positions the model saw stay inside the trained range.
        assert seq.num_computed - eng.runtime.position_offset(rid) <= budget + chunk
    out = eng.output(rid)
    assert len(out.token_ids) == 64 and out.finish_reason == "length"
    assert steps >= 9000 // chunk + 63
    assert eng.stats().blocks_used == 0
