"""The published figures of issue 2, recomputed from presets and the planner's arithmetic."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ctxlab.arch import LayerSpec, get_preset, uniform_layers
from ctxlab.arch.spec import ArchSpec
from ctxlab.plan.capacity import capacity_sentence, kv_budget, max_concurrent
from ctxlab.plan.compute import prefill
from ctxlab.plan.devices import get_device
from ctxlab.plan.memory import mla_vs_mha_ratio, request_memory, with_cache_dtype
from ctxlab.plan.paging import allocated_slots, wasted_slots
from ctxlab.plan.report import build_plan
from ctxlab.plan.units import GIB, KIB, MIB

CTX_128K = 131_072


def test_llama_31_8b_bytes_per_token_request_and_batch():
    arch = get_preset("llama-3.1-8b")
    assert arch.kv_bytes_per_token() == 131_072 == 128 * KIB
    mem = request_memory(arch, CTX_128K, concurrency=8)
    assert mem.bytes_per_request == 16 * GIB
    assert mem.bytes_for_concurrency == 128 * GIB


def test_capacity_80gib_device_48gib_weights_8gib_reserve():
    budget = kv_budget(80 * GIB, 48 * GIB, 8 * GIB)
    assert budget.kv_bytes == 24 * GIB
    per_request = request_memory(get_preset("llama-3.1-8b"), CTX_128K).bytes_per_request
    fits = max_concurrent(budget.kv_bytes, per_request)
    assert fits == 1
    assert "one fits, two do not" in capacity_sentence(fits, CTX_128K, per_request, budget.kv_bytes)


def test_capacity_through_build_plan():
    plan = build_plan(
        "llama-3.1-8b",
        [CTX_128K],
        device="h100",
        weights_bytes=48 * GIB,
        reserve_bytes=8 * GIB,
        concurrency=2,
    )
    assert plan["sections"]["capacity"]["summary"]["kv_budget_bytes"] == 24 * GIB
    row = plan["per_context"][0]
    assert row["max_concurrent_requests"] == 1
    assert row["concurrency_fits"] is False
    assert "one fits, two do not" in row["capacity_sentence"]


def test_page_rounding_1001_tokens_16_token_pages():
    assert allocated_slots(1001, 16) == 1008
    assert wasted_slots(1001, 16) == 7
    plan = build_plan("llama-3.1-8b", [1001], page_size=16)
    row = plan["per_context"][0]
    assert row["allocated_tokens_per_request"] == 1008
    assert row["wasted_tokens_per_request"] == 7
    assert row["wasted_bytes_per_request"] == 7 * 131_072


def test_gemma_3_27b_all_global_against_as_built():
    arch = get_preset("gemma-3-27b")
    all_global = arch.all_global().request_bytes(CTX_128K) / GIB
    as_built = arch.request_bytes(CTX_128K) / GIB
    assert round(all_global, 1) == 62.0
    assert round(as_built, 1) == 10.4


def test_mistral_stops_growing_at_window():
    arch = get_preset("mistral-7b-v0.1")
    assert arch.request_bytes(4096) == 512 * MIB
    assert arch.request_bytes(CTX_128K) == 512 * MIB
    assert arch.request_bytes(4095) < 512 * MIB
    plan = build_plan(arch, [4096, CTX_128K])
    assert plan["sections"]["memory"]["summary"]["growth_stops_at_tokens"] == 4096


def test_llama_prefill_128k_on_h100():
    arch = replace(get_preset("llama-3.1-8b"), params=8_030_000_000)
    result = prefill(arch, CTX_128K, get_device("h100"))
    assert result.seconds == pytest.approx(6.7, abs=0.05)
    assert result.attention_share == pytest.approx(2 / 3, abs=0.02)


def test_eight_bit_cache_halves_llama_128k_cache():
    arch = get_preset("llama-3.1-8b")
    bf16 = arch.request_bytes(CTX_128K)
    int8 = with_cache_dtype(arch, "int8").request_bytes(CTX_128K)
    assert round(bf16 / 1e9, 1) == 17.2
    assert round(int8 / 1e9, 1) == 8.6
    assert int8 * 2 == bf16
    assert with_cache_dtype(arch, "int4").request_bytes(CTX_128K) * 4 == bf16


def test_mla_against_mha_of_same_dtype():
    d_c, d_rope, heads, d_k, d_v, n = 512, 64, 128, 192, 128, 61
    mla = ArchSpec(
        "mla",
        uniform_layers(n, LayerSpec("mla", d_c=d_c, d_rope=d_rope, d_k=d_k, d_v=d_v)),
        n_query_heads=heads,
        hidden_size=7168,
        params=1,
    )
    mha = ArchSpec(
        "mha",
        uniform_layers(n, LayerSpec("full", kv_heads=heads, d_k=d_k, d_v=d_v)),
        n_query_heads=heads,
        hidden_size=7168,
        params=1,
    )
    ratio = mla.kv_bytes_per_token() / mha.kv_bytes_per_token()
    assert ratio == pytest.approx(mla_vs_mha_ratio(d_c, d_rope, heads, d_k, d_v))
    assert ratio == pytest.approx(576 / (128 * 320))


def test_deepseek_v3_preset_is_mla_sized():
    arch = get_preset("deepseek-v3")
    assert arch.kv_bytes_per_token() == 61 * (512 + 64) * 2
