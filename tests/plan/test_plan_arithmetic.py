"""Unit tests of each planner concept on small hand-built architectures."""

from __future__ import annotations

import pytest

from ctxlab.arch import LayerSpec, RecurrentState
from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError
from ctxlab.plan.capacity import capacity_sentence, kv_budget, max_concurrent
from ctxlab.plan.compute import attended_keys, decode, layer_attention_flops, prefill
from ctxlab.plan.cost import HostedPrices, SelfHostedRates, hosted_cost, self_hosted_cost
from ctxlab.plan.devices import Device, get_device
from ctxlab.plan.memory import cache_dtype_bytes, growth_stops_at
from ctxlab.plan.paging import layer_allocated_slots, layer_peak_slots, paged_request
from ctxlab.plan.parallel import replication, scaled_device
from ctxlab.plan.report import build_plan
from ctxlab.plan.sharing import prefix_sharing
from ctxlab.plan.units import GIB, count_word, fmt_bytes, parse_bytes, parse_token_list

FULL = LayerSpec("full", kv_heads=2, d_k=4, d_v=4)  # 16 elements per token
SLIDE = LayerSpec("sliding", kv_heads=2, d_k=4, d_v=4, window=8)
MAMBA = LayerSpec(
    "recurrent", recurrent=RecurrentState("mamba", d_model=4, d_state=2, d_conv=3, expand=2)
)
DEV = Device("toy", peak_flops=1e12, mem_bandwidth=1e9, memory_bytes=GIB)


def arch(*layers: LayerSpec, params: int = 1000) -> ArchSpec:
    return ArchSpec("toy", tuple(layers), n_query_heads=4, hidden_size=16, params=params)


def test_parse_bytes_binary_and_decimal():
    assert parse_bytes("80GiB") == 80 * GIB
    assert parse_bytes("48GiB") == 48 * GIB
    assert parse_bytes("17.2GB") == 17_200_000_000
    assert parse_bytes("512 MiB") == 512 * 1024**2
    assert parse_bytes("4096") == 4096
    with pytest.raises(CtxlabError, match="cannot read"):
        parse_bytes("80 gigs")


def test_parse_token_list():
    assert parse_token_list("4096,131072") == [4096, 131072]
    assert parse_token_list("128K, 1M") == [131072, 1048576]
    for bad in ("0", "-5", "abc", ""):
        with pytest.raises(CtxlabError):
            parse_token_list(bad)


def test_formatting_labels_units():
    assert fmt_bytes(16 * GIB) == "16.0 GiB"
    assert fmt_bytes(512) == "512 B"
    assert count_word(1) == "one"
    assert count_word(42) == "42"


def test_cache_dtypes():
    assert [cache_dtype_bytes(n) for n in ("bf16", "fp16", "fp8", "int8", "int4")] == [
        2,
        2,
        1,
        1,
        0.5,
    ]
    with pytest.raises(CtxlabError, match="known cache dtypes"):
        cache_dtype_bytes("fp6")


def test_sliding_pages_straddle_one_extra_page():
    # Window 8, pages of 4: context 10 keeps positions 2..9, on pages 0, 1, 2.
    assert layer_allocated_slots(SLIDE, 10, 4) == 12
    # Context 12 keeps 4..11: pages 1 and 2 exactly.
    assert layer_allocated_slots(SLIDE, 12, 4) == 8
    assert layer_allocated_slots(SLIDE, 5, 4) == 8
    assert layer_allocated_slots(MAMBA, 100, 4) == 0


def test_sliding_peak_is_what_capacity_reserves():
    # Window 8, pages of 4: at 12 the layer holds 2 pages, but at 10 it held 3.
    assert layer_allocated_slots(SLIDE, 12, 4) == 8
    assert layer_peak_slots(SLIDE, 12, 4) == 12
    assert layer_peak_slots(SLIDE, 8, 4) == 8
    assert layer_peak_slots(FULL, 10, 4) == 12
    plan = build_plan(arch(SLIDE), [12], device=DEV, page_size=4, weights_bytes=0, reserve_bytes=0)
    row = plan["per_context"][0]
    assert row["peak_allocated_bytes_per_request"] == 12 * 16 * 2
    assert row["kv_bytes_per_request_all_gpus"] == 12 * 16 * 2
    assert row["max_concurrent_requests"] == GIB // (12 * 16 * 2)


def test_paged_request_bytes_include_fixed_state():
    a = arch(FULL, MAMBA)
    paged = paged_request(a, 5, 4)
    fixed = a.fixed_state_bytes()
    assert fixed > 0
    assert paged.allocated_bytes == 8 * 16 * 2 + fixed
    assert paged.logical_bytes == 5 * 16 * 2 + fixed
    assert paged.wasted_bytes == 3 * 16 * 2
    assert paged.peak_allocated_bytes == paged.allocated_bytes


def test_sharing_full_sliding_and_recurrent():
    # 3 requests, prefix 6: full layer shares 6 tokens, two copies avoided.
    assert prefix_sharing(arch(FULL), 20, 3, 6).bytes_avoided == 2 * 6 * 16 * 2
    # Sliding window 8 at context 10 holds 2..9: prefix tokens 2..5 still resident.
    assert prefix_sharing(arch(SLIDE), 10, 3, 6).bytes_avoided == 2 * 4 * 16 * 2
    # At context 20 the prefix has left the window.
    assert prefix_sharing(arch(SLIDE), 20, 3, 6).bytes_avoided == 0
    # Recurrent state is per request.
    assert prefix_sharing(arch(MAMBA), 20, 3, 6).bytes_avoided == 0
    # Only whole pages of 4 are shared: 4 of the 6 prefix tokens.
    assert prefix_sharing(arch(FULL), 20, 3, 6, 4).bytes_avoided_full_pages == 2 * 4 * 16 * 2
    # A prefix longer than the context is capped by it.
    assert prefix_sharing(arch(FULL), 5, 2, 6).prefix_tokens == 5


def test_attended_keys_causal_and_windowed():
    assert attended_keys(4) == 1 + 2 + 3 + 4
    assert attended_keys(10, 3) == 1 + 2 + 3 + 7 * 3
    assert attended_keys(3, 8) == 6


def test_attention_flops_by_layer_kind():
    assert layer_attention_flops(FULL, 4, 4) == 2 * 4 * 8 * 10
    assert layer_attention_flops(SLIDE, 4, 10) == 2 * 4 * 8 * attended_keys(10, 8)
    mla = LayerSpec("mla", d_c=16, d_rope=4, d_k=12, d_v=8)
    assert layer_attention_flops(mla, 4, 4) == 2 * 4 * 20 * 10
    absorbed = LayerSpec("mla", d_c=16, d_rope=4)
    assert layer_attention_flops(absorbed, 4, 4) == 2 * 4 * (20 + 16) * 10
    assert layer_attention_flops(MAMBA, 4, 100) == 0


def test_prefill_and_decode_roofline():
    a = arch(FULL, params=1000)
    p = prefill(a, 4, DEV)
    assert p.weight_flops == 2 * 1000 * 4
    assert p.seconds == pytest.approx(p.flops / 1e12)
    d = decode(a, 4, DEV, weights_bytes=2000, batch=3)
    assert d.bytes_per_step == 2000 + 4 * 16 * 2
    assert d.seconds_per_token == pytest.approx(d.bytes_per_step / 1e9)
    assert d.batch_seconds_per_step == pytest.approx((2000 + 3 * 128) / 1e9)


def test_moe_decode_reads_active_share():
    moe = ArchSpec("moe", (FULL,), n_query_heads=4, hidden_size=16, params=1000, active_params=250)
    assert decode(moe, 4, DEV, weights_bytes=2000).weight_bytes == 500
    assert prefill(moe, 4, DEV).weight_flops == 2 * 250 * 4


def test_capacity_errors_and_sentences():
    with pytest.raises(CtxlabError, match="leave no room"):
        kv_budget(80 * GIB, 48 * GIB, 40 * GIB)
    assert max_concurrent(10, 0) is None
    assert "not even one fits" in capacity_sentence(0, 100, 20, 10)
    assert "three fit, four do not" in capacity_sentence(3, 100, 3, 10)


def test_hosted_cost_streams():
    prices = HostedPrices(input=3, output=15, cache_write=3.75, cache_read=0.3)
    c = hosted_cost(prices, 1_000_000, 1_000_000, 1_000_000, 1_000_000)
    assert (c.uncached_input, c.output, c.cache_write, c.cache_read) == (3, 15, 3.75, 0.3)
    assert c.total == pytest.approx(22.05)
    per_1k = HostedPrices(input=3, output=15, unit=1000)
    assert hosted_cost(per_1k, 1000, 0).total == pytest.approx(3)
    # Without cache prices, cached streams bill at the input price.
    assert hosted_cost(HostedPrices(3, 15), 0, 0, cache_read_tokens=10**6).total == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"input": 0, "output": 1},
        {"input": 1, "output": -1},
        {"input": 1, "output": 1, "cache_read": 0},
    ],
)
def test_non_positive_prices_rejected(kwargs):
    with pytest.raises(CtxlabError, match="must be a positive number"):
        HostedPrices(**kwargs)


def test_self_hosted_cost_per_success():
    c = self_hosted_cost(
        gpu_seconds=3600, gpu_hourly=2.0, successes=4, cpu_seconds=1800, cpu_hourly=0.5
    )
    assert c.total == pytest.approx(2.25)
    assert c.per_success == pytest.approx(2.25 / 4)
    with pytest.raises(CtxlabError, match="successful requests"):
        self_hosted_cost(10, 2.0, successes=0)
    with pytest.raises(CtxlabError, match="GPU hourly"):
        SelfHostedRates(gpu_hourly=0)


def test_tensor_parallel_copies():
    assert replication(LayerSpec("full", kv_heads=8, d_k=1, d_v=1), 4) == 1
    assert replication(LayerSpec("full", kv_heads=2, d_k=1, d_v=1), 8) == 4
    assert replication(LayerSpec("mla", d_c=4, d_rope=1), 8) == 8
    assert scaled_device(get_device("h100"), 8).memory_bytes == 8 * 80 * GIB


def test_growth_stops_only_without_global_layers():
    assert growth_stops_at(arch(SLIDE, MAMBA)) == 8
    assert growth_stops_at(arch(SLIDE, FULL)) is None


def test_build_plan_sections_name_their_layer():
    plan = build_plan(
        arch(FULL, SLIDE, MAMBA),
        [4, 64],
        device=DEV,
        weights_bytes=0,
        reserve_bytes=0,
        prices=HostedPrices(1, 2),
        self_hosted=SelfHostedRates(1.0),
        shared_prefix=2,
        concurrency=2,
    )
    layers = {name: s["layer"] for name, s in plan["sections"].items()}
    assert layers == {
        "memory": "representation",
        "paging": "allocation",
        "sharing": "sharing",
        "capacity": "capacity",
        "compute": "compute",
        "cost": "cost",
    }
    for section in plan["sections"].values():
        assert [r["context_tokens"] for r in section["rows"]] == [4, 64]
    row = plan["per_context"][1]
    # cold: 62 uncached + 2 written; warm: 62 uncached + 2 read, all at the input price.
    assert row["hosted_cold_cost"] == pytest.approx((64 + 2 * 256) / 1e6)
    assert row["self_hosted_cost_per_success"] == pytest.approx(
        row["self_hosted_gpu_seconds"] / 3600
    )
