"""Longformer and BigBird patterns applied in prefill (`longformer-prefill`, `bigbird-prefill`).

- the pattern equals a mask written out by hand on a tiny case, and a chunk's rows equal
  the whole prompt's mask (chunked prefill asks for rows, not the whole square);
- in the paged engine on the float64 toy model, the prompt's log-probabilities under the
  mask equal an independent dense forward that applies `policy.mask(T)` (one chunk, chunks
  of 13 tokens, prefix reuse), differ from the unmasked ones, and a mask that allows every
  key gives the unmasked prefill's;
- the places that cannot take the mask refuse it in one sentence.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from engine_toy_model import CFG, ToyModel, one_torch_thread  # noqa: F401  (fixture)

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.errors import CtxlabError
from ctxlab.policy import make_policy
from ctxlab.policy.longformer import LongformerPrefillPolicy

MODEL = ToyModel(with_rope=True)


def test_longformer_prefill_mask_is_the_hand_built_pattern():
    """T = 9, local 3, first token global, the last 2 prompt tokens global (the question)."""
    p = make_policy("longformer-prefill", local=3, n_global=1, question=2)
    want = [
        [1, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 1, 1, 0, 0, 0, 0],  # key 1 is out of the window, key 0 is global
        [1, 0, 0, 1, 1, 1, 0, 0, 0],
        [1, 0, 0, 0, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 0],  # the question's rows see every earlier key
        [1, 1, 1, 1, 1, 1, 1, 1, 1],
    ]
    assert p.mask(9).int().tolist() == want
    # the decode-only form keeps its own mask (first tokens global only)
    lf = make_policy("longformer", local=3, n_global=1)
    assert lf.mask(9)[7].int().tolist() == [1, 0, 0, 0, 0, 1, 1, 1, 0]
    assert lf.prefill_mask(torch.arange(9), torch.arange(9), 9) is None
    assert lf.prefill_key(9) is None and p.prefill_key(9) != p.prefill_key(10)


def test_bigbird_prefill_mask_adds_seeded_random_keys_per_query():
    T = 60
    bb = make_policy("bigbird-prefill", local=4, n_global=2, question=3, n_random=5, seed=7)
    lf = make_policy("longformer-prefill", local=4, n_global=2, question=3)
    m, base = bb.mask(T), lf.mask(T)
    assert not torch.any(torch.triu(m, 1)), "causal"
    assert torch.all(m | ~base), "BigBird contains Longformer's pattern"
    extra = (m & ~base).sum(1)
    # a plain query with at least 5 candidate keys behind its window gets exactly 5 more
    assert extra[2 + 4 + 5 - 1 : T - 3].eq(5).all()
    assert int(extra[:6].sum()) == 0 and int(extra[T - 3 :].sum()) == 0  # global rows: all
    same = make_policy("bigbird-prefill", local=4, n_global=2, question=3, n_random=5, seed=7)
    other = make_policy("bigbird-prefill", local=4, n_global=2, question=3, n_random=5, seed=8)
    assert torch.equal(m, same.mask(T)) and not torch.equal(m, other.mask(T))


@pytest.mark.parametrize("name", ["longformer-prefill", "bigbird-prefill"])
def test_a_chunks_rows_are_the_prompts_mask(name):
    p = make_policy(
        name, local=4, n_global=2, question=3, **({"n_random": 3} if "big" in name else {})
    )
    T = 50
    whole = p.mask(T)
    q = torch.arange(20, 33)
    assert torch.equal(p.prefill_mask(q, torch.arange(40), T), whole[20:33, :40])
    # keys not at lane index = position (a gathered subset): the same entries
    k = torch.tensor([0, 1, 5, 9, 17, 18, 19, 25])
    assert torch.equal(p.prefill_mask(q, k, T), whole[20:33][:, k])


# -- in the engine ------------------------------------------------------------------------
class MaskedDense:
    """An independent reference: one forward over the whole prompt, dense SDPA under `mask`."""

    def __init__(self, mask: torch.Tensor):
        self.mask = mask

    def attend(self, layer, q, k, v):
        g = q.shape[1] // k.shape[1]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.repeat_interleave(g, 1).transpose(0, 1),
            v.repeat_interleave(g, 1).transpose(0, 1),
            attn_mask=self.mask,
        )
        return o.transpose(0, 1)


@torch.inference_mode()
def ref_logprobs(ids: list[int], mask: torch.Tensor) -> torch.Tensor:
    h = MODEL.forward(torch.tensor(ids), torch.arange(len(ids)), MaskedDense(mask))
    lp = torch.log_softmax(MODEL.compute_logits(h[:-1]), -1)
    return lp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def engine_logprobs(ids: list[int], policy, chunk: int, eng: LLMEngine | None = None):
    eng = eng or LLMEngine(
        MODEL, CFG, kv_pool_tokens=1024, block_size=4, max_num_batched_tokens=chunk, policy=policy
    )
    rid = eng.add_request(ids, SamplingParams(max_tokens=3, prompt_logprobs=True))
    (out,) = eng.run_all([rid])
    return torch.tensor([x for x in out.prompt_logprobs if x is not None], dtype=torch.float64)


def prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(CFG.vocab_size) for _ in range(n)]


@pytest.mark.parametrize("chunk", [512, 13], ids=["one-chunk", "chunks-of-13"])
@pytest.mark.parametrize("name", ["longformer-prefill", "bigbird-prefill"])
def test_engine_prefill_under_the_mask_equals_a_dense_masked_forward(name, chunk):
    extra = {"n_random": 3} if "big" in name else {}
    policy = make_policy(name, local=8, n_global=2, question=4, **extra)
    ids = prompt(70, seed=1)
    mask = policy.mask(len(ids))
    got = engine_logprobs(ids, policy, chunk)
    torch.testing.assert_close(got, ref_logprobs(ids, mask))
    causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    assert not torch.allclose(got, ref_logprobs(ids, causal)), "the mask changed the prefill"


@dataclass
class AllKeys(LongformerPrefillPolicy):
    """A prefill mask that allows every key (the engine adds causality)."""

    name: ClassVar[str] = "all-keys"
    local: int = 10_000

    def prefill_mask(self, q_pos, k_pos, prompt_len):
        return torch.ones(len(q_pos), len(k_pos), dtype=torch.bool)


@pytest.mark.parametrize("chunk", [512, 13], ids=["one-chunk", "chunks-of-13"])
def test_an_all_true_mask_gives_the_unmasked_prefill(chunk):
    ids = prompt(70, seed=2)
    plain = engine_logprobs(ids, None, chunk)
    torch.testing.assert_close(engine_logprobs(ids, AllKeys(), chunk), plain)
    # and the real pattern with a window longer than the prompt
    wide = make_policy("longformer-prefill", local=10_000)
    torch.testing.assert_close(engine_logprobs(ids, wide, chunk), plain)


def test_prefix_reuse_only_under_the_same_mask_and_prompt_end():
    policy = make_policy("longformer-prefill", local=8, n_global=2, question=4)
    eng = LLMEngine(
        MODEL, CFG, kv_pool_tokens=1024, block_size=4, max_num_batched_tokens=16, policy=policy
    )
    ids = prompt(60, seed=3)
    first = engine_logprobs(ids, None, 16, eng)
    torch.testing.assert_close(first, ref_logprobs(ids, policy.mask(len(ids))))
    # a reused token has no log-probability: the ones computed again follow the mask
    again = engine_logprobs(ids, None, 16, eng)
    assert eng.stats().prefix_cache_hits > 0 and len(again) < len(first), "blocks reused"
    torch.testing.assert_close(again, first[-len(again) :])
    hits = eng.stats().prefix_cache_hits
    longer = ids + prompt(12, seed=4)  # its rows 56-59 are no longer the question
    got = engine_logprobs(longer, None, 16, eng)
    assert eng.stats().prefix_cache_hits == hits, "another prompt end: nothing shared"
    torch.testing.assert_close(got, ref_logprobs(longer, policy.mask(len(longer))))
    # an unmasked engine's blocks are never read under the mask, nor the mask's unmasked
    eng.set_policy(None)
    plain = engine_logprobs(ids, None, 16, eng)
    torch.testing.assert_close(plain, ref_logprobs(ids, torch.ones(60, 60).tril().bool()))
    eng.set_policy(policy)
    again = engine_logprobs(ids, None, 16, eng)
    torch.testing.assert_close(again, first[-len(again) :])


def test_follow_up_and_transformers_path_refuse_the_mask():
    policy = make_policy("longformer-prefill", local=8, n_global=2, question=4)
    eng = LLMEngine(MODEL, CFG, kv_pool_tokens=1024, block_size=4, policy=policy)
    rid = eng.add_request(prompt(40), SamplingParams(max_tokens=2), hold=True)
    eng.run_all([rid])
    with pytest.raises(CtxlabError, match="masks prefill"):
        eng.follow_up(rid, [1, 2, 3])
    with pytest.raises(CtxlabError, match="question >= 1"):
        make_policy("longformer-prefill", question=0)
    hf_runtime = pytest.importorskip("ctxlab.hf.runtime")
    from ctxlab.kv.layout import KVLayout

    layout = KVLayout(n_layers=2, n_kv_heads=2, head_dim=8, head_dim_v=8, block_size=4)
    with pytest.raises(CtxlabError, match="transformers' own attention"):
        hf_runtime.HFRuntime(policy, layout, 4, 4)
