"""The capacity section confirms a published pool with a bounded number of fills, and the
isolation prompt is sized from the page; checked on a simulated paged LRU cache (vLLM's
free-block queue: a finished request's blocks go to the queue's end, its tail first, and a
new block is taken from the front), so the arithmetic is tested without a server."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from ctxlab.probe import capacity, isolation
from ctxlab.probe.client import Answer, Budget
from ctxlab.probe.hints import cached_tokens_hint
from ctxlab.probe.metrics import parse, published_block_size
from ctxlab.probe.prompts import TokenRule, Words, reusable_tokens


class PagedLRU:
    """A stand-in for ProbeClient.complete over a vLLM-like prefix cache of `blocks` pages."""

    def __init__(self, blocks: int, page: int, budget: Budget | None = None) -> None:
        self.page, self.blocks = page, blocks
        self.cache: OrderedDict[tuple, None] = OrderedDict()  # block key -> None, LRU first
        self.budget = budget or Budget(10_000, 10_000_000)
        self.requests = 0
        self.tokens = 0

    def complete(self, prompt: str, planned_tokens: int, salt: str | None = None, **_) -> Answer:
        self.budget.take(planned_tokens)
        words = prompt.split()
        self.requests += 1
        self.tokens += len(words)
        keys = [(salt, tuple(words[: (i + 1) * self.page])) for i in range(len(words) // self.page)]
        cached = 0
        for k in keys:  # a hit must be a prefix of hits; the last token is always computed
            if k in self.cache and (cached + 1) * self.page < len(words):
                cached += 1
            else:
                break
        for k in keys[:cached]:  # in use while the request runs: not evictable
            self.cache.pop(k)
        for k in keys[cached:]:  # new blocks: evict from the front (least recent)
            self.cache.pop(k, None)
            while len(self.cache) + cached >= self.blocks:
                self.cache.popitem(last=False)
            self.cache[k] = None
        for k in reversed(keys):  # freed tail first: the tail is evicted before the head
            self.cache[k] = None
            self.cache.move_to_end(k)
        return Answer(len(words), cached * self.page, "usage.prompt_tokens_details", 0.01)


RULE = TokenRule(offset=0, how="test")


def _measure(cache: PagedLRU, published: int | None):
    return capacity.measure(
        cache, Words(7), RULE, cache.page, 4096, lambda _m: None, published=published
    )


def test_published_pool_confirmed_in_one_fill_within_one_page():
    cache = PagedLRU(blocks=364, page=128)  # 46,592 tokens, as vLLM publishes at 1 GiB
    res = _measure(cache, 364 * 128)
    assert res.capacity.how == "measured", res.capacity
    assert abs(res.capacity.value - 364 * 128) <= 128
    assert len(res.trials) == 1
    assert "confirms the published 46,592 tokens" in res.capacity.note
    assert cache.tokens < 2 * 364 * 128  # one fill and a sentinel, not a search


@pytest.mark.parametrize("real_blocks", [356, 372])  # 1,024 tokens under and over
def test_a_published_figure_a_little_off_is_found_by_sliding(real_blocks):
    cache = PagedLRU(blocks=real_blocks, page=128)
    res = _measure(cache, 364 * 128)
    assert res.capacity.how == "measured", res.capacity
    assert abs(res.capacity.value - real_blocks * 128) <= 128
    assert len(res.trials) <= capacity.CONFIRM_TRIALS


def test_a_published_figure_far_off_stops_after_bounded_fills():
    cache = PagedLRU(blocks=100, page=128)  # the server publishes 364 blocks, holds 100
    res = _measure(cache, 364 * 128)
    assert len(res.trials) == capacity.CONFIRM_TRIALS
    assert res.capacity.how == "inferred"
    assert "not confirmed within 4 fills" in res.capacity.note


def test_without_a_published_pool_the_search_still_finds_it():
    cache = PagedLRU(blocks=40, page=16)
    res = _measure(cache, None)
    assert res.capacity.how == "measured" and abs(res.capacity.value - 640) <= 16


def test_budget_stops_the_confirmation_with_a_bound():
    cache = PagedLRU(blocks=364, page=128, budget=Budget(10_000, 20_000))
    res = _measure(cache, 364 * 128)
    assert res.capacity.how == "inferred"
    assert "the budget" in res.capacity.note and "ran out" in res.capacity.note


@pytest.mark.parametrize("page", [1, 16, 128, 256])
def test_isolation_prompt_holds_two_pages_and_a_tail(page):
    n = reusable_tokens(page)
    assert n >= 2 * page + 1 and n >= 96
    cache = PagedLRU(blocks=max(64, 4 * reusable_tokens(page) // page), page=page)
    res = isolation.measure(cache, Words(3), RULE, 5, lambda _m: None, page)
    assert res.isolates.value is True and res.isolates.how == "measured", res.isolates
    assert res.reused["same salt"] >= 2 * page
    assert res.reused["other salt"] == 0 and res.reused["no salt"] == 0


@pytest.mark.parametrize(
    "engine,flag",
    [("vllm", "--enable-prompt-tokens-details"), ("sglang", "--enable-cache-report")],
)
def test_missing_cached_tokens_names_the_engine_flag(engine, flag):
    assert flag in cached_tokens_hint(engine)
    assert "--enable-prompt-tokens-details" in cached_tokens_hint("unknown")


def test_the_published_block_size_is_read_from_cache_config_info():
    text = 'vllm:cache_config_info{block_size="128",num_gpu_blocks="364"} 1.0\n'
    assert published_block_size(parse(text)) == 128
    assert published_block_size(parse("llamacpp:prompt_tokens_total 3\n")) is None


def test_a_hybrid_models_pool_is_vllms_own_token_figure():
    """Gemma 3 270M on vLLM 0.32 at 1 GiB: 2,730 blocks shared by 6 KV cache groups."""
    from ctxlab.probe.metrics import published_capacity

    gemma = (
        'vllm:cache_config_info{block_size="128",num_gpu_blocks="2730",'
        'kv_cache_size_tokens="81621"} 1.0\n'
    )
    assert published_capacity(parse(gemma)).value == 81621
    smol = (
        'vllm:cache_config_info{block_size="128",num_gpu_blocks="364",'
        'kv_cache_size_tokens="46592"} 1.0\n'
    )
    assert published_capacity(parse(smol)).value == 46592
