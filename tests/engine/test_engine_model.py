"""The engine on the default model (SmolLM2-135M, fp32): parity with transformers greedy,
prefix-cache reuse, pool pressure and bad input."""

from __future__ import annotations

import pytest
import torch

from ctxlab.engine import LLM, SamplingParams
from ctxlab.errors import CtxlabError

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]

N_OUT = 64
PROMPTS = [
    "The history of the printing press begins in the fifteenth century, when a goldsmith in "
    "Mainz combined movable metal type, oil-based ink and a screw press. Explain why",
    "def merge_sort(xs):\n    # Sort a list of integers with merge sort and return a new list.\n",
    "Write a short letter to a neighbour asking them to water the plants while you are away "
    "for two weeks in August.",
    "Q: A train leaves the station at 9:40 in the morning and arrives in the city at 13:05. "
    "How long is the journey in hours and minutes?\nA:",
]
GREEDY = SamplingParams(max_tokens=N_OUT, ignore_eos=True)


@torch.inference_mode()
def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    """Plain argmax loop over transformers' forward with its KV cache (no eos handling, so
    it matches `ignore_eos=True`; `generate(min_new_tokens=...)` would mask eos instead)."""
    out: list[int] = []
    res = hf(torch.tensor([ids]), use_cache=True)
    for _ in range(n):
        tok = int(res.logits[0, -1].argmax())
        out.append(tok)
        res = hf(torch.tensor([[tok]]), cache=res.cache, use_cache=True)
    return out


@pytest.fixture(scope="module")
def prompt_ids(loaded):
    return [loaded.tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def expected(hf_model, prompt_ids):
    return [hf_greedy(hf_model, ids, N_OUT) for ids in prompt_ids]


def make(loaded, **kw) -> LLM:
    args = dict(kv_pool_tokens=4096, block_size=16, max_num_batched_tokens=2048)
    args.update(kw)
    return LLM(loaded, **args)


def test_greedy_matches_transformers_one_at_a_time(loaded, prompt_ids, expected):
    assert all(len(ids) > 16 for ids in prompt_ids)
    llm = make(loaded, max_num_seqs=1)
    got = [o.token_ids for o in llm.generate(prompt_ids, GREEDY)]
    assert got == expected


def test_greedy_matches_transformers_as_one_batch(loaded, prompt_ids, expected):
    llm = make(loaded)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert outs[0].text == loaded.tokenizer.decode(expected[0])


def test_greedy_matches_with_small_chunked_prefill_budget(loaded, prompt_ids, expected):
    llm = make(loaded, max_num_batched_tokens=16)  # every prompt is split into chunks
    assert [o.token_ids for o in llm.generate(prompt_ids, GREEDY)] == expected


def test_pool_pressure_preempts_and_gives_the_same_text(loaded, prompt_ids, expected):
    need = max(len(ids) for ids in prompt_ids) + N_OUT
    llm = make(loaded, kv_pool_tokens=need + 32)  # about one request at a time
    outs = llm.generate(prompt_ids, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert sum(o.metrics.preemptions for o in outs) > 0
    assert llm.stats().blocks_used == 0


@pytest.fixture(scope="module")
def long_ids(loaded):
    text = " ".join(f"Item {i}: the {['red', 'blue', 'green'][i % 3]} box." for i in range(400))
    ids = loaded.tokenizer.encode(text)
    assert len(ids) >= 1000
    return ids[:1000]


def test_prefix_cache_reuse_rules(loaded, long_ids):
    llm = make(loaded, kv_pool_tokens=8192)
    one = SamplingParams(max_tokens=8, ignore_eos=True)
    first = llm.generate([long_ids], one)[0]
    assert first.metrics.reused_tokens == 0
    again = llm.generate([long_ids], one)[0]
    # Every full block but the one holding the last token: 999 // 16 = 62 blocks.
    assert again.metrics.reused_tokens == 62 * 16
    assert again.token_ids == first.token_ids
    changed0 = [(long_ids[0] + 1) % 1000, *long_ids[1:]]
    assert llm.generate([changed0], one)[0].metrics.reused_tokens == 0
    p = 500
    changed_p = [*long_ids[:p], (long_ids[p] + 1) % 1000, *long_ids[p + 1 :]]
    assert llm.generate([changed_p], one)[0].metrics.reused_tokens == (p // 16) * 16
    salted = llm.generate([long_ids], one, cache_salt="tenant-b")[0]
    assert salted.metrics.reused_tokens == 0
    assert salted.token_ids == first.token_ids
    stats = llm.stats()
    assert stats.prefix_cache_hits == 62 * 16 + (p // 16) * 16
    assert stats.prefix_cache_queries == 5 * 1000
    no_cache = make(loaded, kv_pool_tokens=8192, enable_prefix_caching=False)
    assert no_cache.generate([long_ids], one)[0].token_ids == first.token_ids


def test_streaming_yields_the_same_tokens(loaded, prompt_ids, expected):
    llm = make(loaded)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    events = list(llm.stream([prompt_ids[0]], params))
    assert [e.token_id for e in events] == expected[0][:8]
    assert events[-1].finished and events[-1].output is not None
    assert "".join(e.text_delta for e in events) == events[-1].output.text


@pytest.mark.parametrize(
    ("prompt", "kw", "pool", "msg"),
    [
        ("", {}, 4096, "prompt is empty"),
        ([5] * 8192, {}, 16384, "maximum"),
        ("hi", {"max_tokens": 0}, 4096, "max_tokens"),
        ("hi", {"top_p": 1.5}, 4096, "top_p"),
        ("hi " * 100, {"max_tokens": 64}, 64, "KV pool holds"),
    ],
)
def test_bad_input_is_one_clear_sentence(loaded, prompt, kw, pool, msg):
    with pytest.raises(CtxlabError, match=msg) as err:
        make(loaded, kv_pool_tokens=pool).generate(prompt, SamplingParams(**kw))
    assert str(err.value).endswith(".")
