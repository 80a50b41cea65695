"""The planner's defaults work for every preset: the fewest devices that hold the weights."""

from __future__ import annotations

import math

import pytest

from ctxlab.arch import PRESETS, get_preset
from ctxlab.errors import CtxlabError
from ctxlab.plan.devices import get_device
from ctxlab.plan.parallel import accepts_tp
from ctxlab.plan.report import build_plan

GIB = 2**30


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_plans_with_the_defaults(name):
    plan = build_plan(name, [4096, 32768, 131072], gpus=None)
    gpus = plan["inputs"]["gpus"]
    weights = plan["inputs"]["weights_bytes"]
    one = get_device("h100").memory_bytes
    # the fewest that vLLM accepts as a tensor-parallel size: every smaller size it accepts
    # cannot hold the weights plus its 10 % reserve
    spec = get_preset(name)
    assert weights + 0.1 * one * gpus < one * gpus
    assert accepts_tp(spec, gpus)
    for smaller in range(1, gpus):
        if accepts_tp(spec, smaller):
            assert weights + 0.1 * one * smaller >= one * smaller
    if gpus > 1:
        assert plan["inputs"]["gpus_source"].startswith("the fewest h100")
        assert any("Planned on" in note for note in plan["notes"])


def test_published_weight_formats_decide_the_count():
    """DeepSeek-V3 ships FP8 (625 GiB: 9 x H100 hold it, but vLLM needs the tensor-parallel
    size to divide its 128 heads: 16); gpt-oss-120b ships MXFP4 (fits one)."""
    deepseek = build_plan("deepseek-v3", [4096], gpus=None)
    assert deepseek["inputs"]["weights_bytes"] == 671_000_000_000
    assert deepseek["inputs"]["gpus"] == 16
    assert "are 9, rounded up to 16" in deepseek["inputs"]["gpus_source"]
    assert any("rounded up to 16" in note for note in deepseek["notes"])
    oss = get_preset("gpt-oss-120b")
    assert 63e9 < oss.weight_bytes < 66e9  # MoE at 4.25 bits, the rest at 16: ~65 GB
    assert build_plan(oss, [4096], gpus=None)["inputs"]["gpus"] == 1
    llama = build_plan("llama-3.1-405b", [4096], gpus=None)["inputs"]
    fewest = math.ceil(get_preset("llama-3.1-405b").weight_bytes / (0.9 * 80 * GIB))
    assert fewest == 11
    assert llama["gpus"] == 16  # 128 query heads, 8 KV heads: 12 to 15 do not split them


def test_an_explicit_count_that_cannot_hold_the_weights_names_the_one_that_would():
    with pytest.raises(CtxlabError, match=r"16 x h100 would hold them \(--gpus 16"):
        build_plan("llama-3.1-405b", [4096], gpus=4)
    assert build_plan("llama-3.1-405b", [4096], gpus=11)["inputs"]["gpus_source"] == "given"


def test_a_given_count_vllm_would_refuse_is_said_not_hidden():
    notes = build_plan("deepseek-v3", [4096], gpus=9)["notes"]
    assert any(
        "9 GPUs is not a tensor-parallel size vLLM accepts for 128 query heads" in n
        and "nearest above that it accepts is 16" in n
        for n in notes
    )
    assert not any(
        "tensor-parallel size vLLM" in n
        for n in build_plan("deepseek-v3", [4096], gpus=16)["notes"]
    )


def test_accepted_tensor_parallel_sizes():
    llama = get_preset("llama-3.1-8b")  # 32 query heads, 8 KV heads
    assert [tp for tp in range(1, 33) if accepts_tp(llama, tp)] == [1, 2, 4, 8, 16, 32]
    smol = get_preset("smollm2-135m")  # 9 query heads, 3 KV heads
    assert [tp for tp in range(1, 10) if accepts_tp(smol, tp)] == [1, 3, 9]


def test_contexts_beyond_the_trained_length_are_flagged_not_refused():
    plan = build_plan("llama-2-7b", [2048, 8192])
    flags = [r["beyond_trained_length"] for r in plan["sections"]["memory"]["rows"]]
    assert flags == [False, True]
    assert any("beyond llama-2-7b's trained length of 4,096" in n for n in plan["notes"])


def test_absurd_and_impossible_inputs_are_one_sentence():
    for kwargs, fragment in (
        ({"contexts": [2**40]}, "absurdly large"),
        ({"contexts": [4096], "shared_prefix": 5000}, "cannot exceed the context"),
        ({"contexts": [4096], "page_size": 10**6}, "absurdly large"),
        ({"contexts": [4096], "gpus": 10**6}, "absurdly large"),
    ):
        contexts = kwargs.pop("contexts")
        with pytest.raises(CtxlabError, match=fragment):
            build_plan("llama-3.1-8b", contexts, **kwargs)


def test_cost_rows_carry_the_currency():
    from ctxlab.plan.cost import HostedPrices

    plan = build_plan("llama-3.1-8b", [4096], prices=HostedPrices(3, 15), currency="EUR")
    assert plan["inputs"]["currency"] == "EUR"
    assert plan["sections"]["cost"]["summary"]["currency"] == "EUR"


def test_axis_labels_read_in_plain_units():
    from ctxlab.plan.units import short_bytes, short_tokens

    assert [short_tokens(n) for n in (256, 1000, 4096, 131072, 1048576)] == [
        "256",
        "1000",
        "4K",
        "128K",
        "1M",
    ]
    assert [short_bytes(n) for n in (512 * 2**20, 2**30, 1.5 * 2**40)] == [
        "512 MiB",
        "1 GiB",
        "1.5 TiB",
    ]
