"""The probe's pure parts: the staircase's step, the token rule, what /metrics publishes,
and a URL shown without its credentials."""

from __future__ import annotations

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.probe.identify import check_url, public_url
from ctxlab.probe.metrics import parse, published_capacity
from ctxlab.probe.prefix import granularity_of, positions
from ctxlab.probe.prompts import check_rule


def _points(cached_of):
    return [{"position": d, "prompt_tokens": d + 8, "cached": cached_of(d)} for d in positions(200)]


@pytest.mark.parametrize("page", [8, 16, 32, 64])
def test_a_paged_staircase_gives_its_page(page):
    f = granularity_of(_points(lambda d: d // page * page))
    assert (f.value, f.how) == (page, "measured")


def test_a_token_granular_cache_gives_one():
    f = granularity_of(_points(lambda d: d))
    assert (f.value, f.how) == (1, "measured") and "token by token" in f.note


def test_one_step_seen_is_only_inferred():
    f = granularity_of(_points(lambda d: d // 128 * 128))
    assert f.value == 128 and f.how == "inferred"


def test_nothing_cached_is_not_measurable():
    assert granularity_of(_points(lambda d: 0)).how == "not measurable"


def test_an_irregular_staircase_is_not_called_a_page():
    f = granularity_of(_points(lambda d: d // 16 * 16 if d < 100 else 96))
    assert f.how == "inferred" and "not floor" in f.note


def test_token_rule_measures_the_offset_and_refuses_split_words():
    rule = check_rule({48: 49, 112: 113}, {48: 48, 112: 112})
    assert rule.offset == 1 and "/tokenize" in rule.how
    assert rule.words_for(100) == 99
    with pytest.raises(CtxlabError, match="not one token per word"):
        check_rule({48: 60, 112: 140}, None)


def test_published_capacity_from_vllm_cache_config_info():
    text = (
        "# HELP vllm:cache_config_info Information of the cache config.\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="5691"} 1.0\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
    )
    f = published_capacity(parse(text))
    assert (f.value, f.how) == (5691 * 16, "measured")
    sg = published_capacity(parse('sglang:max_total_num_tokens{model_name="m"} 123456.0\n'))
    assert sg.value == 123456
    assert published_capacity(parse("llamacpp:prompt_tokens_total 3\n")).how == "not measurable"


def test_url_shown_without_credentials():
    assert public_url("https://user:secret@gpu.example:8443/base/?key=x") == (
        "https://gpu.example:8443/base"
    )
    # one rule for every base URL (ctxlab.peer.url): a trailing /v1 names the same root
    assert check_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    with pytest.raises(CtxlabError, match="must be an http"):
        check_url("127.0.0.1:8000")
