"""The planner predicts what a real engine allocates: vLLM exactly, SGLang and llama.cpp from
their documented rules.

The vLLM figures at 1 GiB are vLLM 0.32 CPU's own start-up output (`VLLM_CPU_KVCACHE_SPACE=1`,
bf16, block 128), published in issue 36; the others are worked by hand from the rules in
vllm/v1/core/kv_cache_utils.py and vllm/v1/kv_cache_interface.py, written out beside each
expectation so a wrong rule, not only a wrong sum, fails.
"""

from __future__ import annotations

import pytest

from ctxlab.arch import get_preset
from ctxlab.errors import CtxlabError
from ctxlab.plan.engines import engine_names, predict_engine_pool
from ctxlab.plan.engines.vllm import group_layers, layer_spec

GIB = 2**30
SMOL = get_preset("smollm2-135m")
GEMMA = get_preset("gemma-3-270m")


def cpu_vllm(spec, kv_bytes, max_model_len, **kw):
    return predict_engine_pool(
        spec, "vllm", platform="cpu", kv_cache_bytes=kv_bytes, max_model_len=max_model_len, **kw
    )


# -- vLLM's published start-up figures (issue 36's table) ---------------------------------


def test_smollm2_at_1_gib_is_what_vllm_cpu_printed():
    pool = cpu_vllm(SMOL, GIB, 4096)
    assert pool.num_blocks == 364
    assert f"{pool.max_concurrency:.2f}" == "11.38"
    assert pool.kv_cache_tokens == 46_592
    assert "CPU KV cache size: 46,592 tokens" in pool.log_line
    assert "11.38x" in pool.log_line


def test_gemma3_270m_at_1_gib_is_what_vllm_cpu_printed():
    pool = cpu_vllm(GEMMA, GIB, 32768)
    assert pool.num_blocks == 2_730
    assert f"{pool.max_concurrency:.2f}" == "7.56"
    assert pool.kv_cache_tokens == 247_802
    assert "CPU KV cache size: 247,802 tokens" in pool.log_line
    # 2,730 / 7.56 = 361 blocks per request: 256 for the global group's 32K tokens and 21
    # for each of the five sliding groups, not the 4 blocks a 512-token window needs.
    assert pool.blocks_per_request == 361
    assert sorted(g.blocks_per_request for g in pool.groups) == [21] * 5 + [256]


def test_gemma3_groups_are_six_groups_of_three_layers():
    pool = cpu_vllm(GEMMA, GIB, 32768)
    layers = sorted(g.layers for g in pool.groups)
    # 15 sliding layers dealt round-robin into 5 groups of 3, the 3 globals in one group
    assert layers == [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 16), (5, 11, 17)]
    # page: 128 tokens x 1 head x (256 + 256) x 2 bytes = 128 KiB; a block spans 3 layers
    assert {g.block_bytes for g in pool.groups} == {3 * 128 * 1024}
    assert pool.bytes_per_block == 393_216


# -- the same rules at other pool sizes and lengths, worked by hand -------------------------


@pytest.mark.parametrize(
    ("kv_bytes", "max_model_len", "blocks", "per_request", "concurrency"),
    [
        # SmolLM2: one group of 30 layers, 30 x 128 x 3 x 128 x 2 = 2,949,120 bytes a block
        (GIB // 4, 4096, 91, 32, "2.84"),  # 268,435,456 // 2,949,120 = 91; 4096 / 128 = 32
        (GIB // 4, 2048, 91, 16, "5.69"),
        (4 * GIB, 4096, 1456, 32, "45.50"),
        (4 * GIB, 2048, 1456, 16, "91.00"),
    ],
)
def test_smollm2_pools_at_other_sizes(kv_bytes, max_model_len, blocks, per_request, concurrency):
    pool = cpu_vllm(SMOL, kv_bytes, max_model_len)
    assert pool.bytes_per_block == 2_949_120
    assert (pool.num_blocks, pool.blocks_per_request) == (blocks, per_request)
    assert f"{pool.max_concurrency:.2f}" == concurrency


@pytest.mark.parametrize(
    ("kv_bytes", "max_model_len", "blocks", "per_request", "concurrency"),
    [
        # 268,435,456 // 393,216 = 682; sliding groups: ceil(min(511 + 2048, L) / 128) + 1 = 21
        (GIB // 4, 32768, 682, 256 + 5 * 21, "1.89"),
        (GIB // 4, 16384, 682, 128 + 5 * 21, "2.93"),
        (4 * GIB, 32768, 10_922, 361, "30.25"),
        (4 * GIB, 16384, 10_922, 233, "46.88"),
        # at 2,048 tokens the window reservation is capped by the length: ceil(2048/128)+1
        (GIB, 2048, 2_730, 16 + 5 * 17, "27.03"),
    ],
)
def test_gemma3_pools_at_other_sizes(kv_bytes, max_model_len, blocks, per_request, concurrency):
    pool = cpu_vllm(GEMMA, kv_bytes, max_model_len)
    assert (pool.num_blocks, pool.blocks_per_request) == (blocks, per_request)
    assert f"{pool.max_concurrency:.2f}" == concurrency


def test_batched_tokens_widen_what_a_sliding_group_reserves():
    # ceil(min(511 + 8192, 32768) / 128) + 1 = 69 blocks in each of 5 sliding groups
    pool = cpu_vllm(GEMMA, GIB, 32768, max_num_batched_tokens=8192)
    assert pool.blocks_per_request == 256 + 5 * 69


def test_gpu_async_scheduling_doubles_the_tokens_in_flight():
    # GPU defaults: block 16, two batches in flight of 8,192 (an 80 GiB device):
    # ceil(min(511 + 16384, 32768) / 16) + 1 = 1057 per sliding group, 2048 for the globals
    pool = predict_engine_pool(
        GEMMA, "vllm", kv_cache_bytes=GIB, max_model_len=32768, device_memory_bytes=80 * GIB
    )
    assert pool.block_size == 16
    assert pool.blocks_per_request == 2048 + 5 * 1057


def test_disabling_the_hybrid_manager_makes_every_layer_full():
    pool = cpu_vllm(GEMMA, GIB, 32768, disable_hybrid=True)
    assert len(pool.groups) == 1
    # 18 layers x 128 KiB = 2,359,296 bytes a block; 455 blocks; 256 per request
    assert (pool.num_blocks, pool.blocks_per_request) == (455, 256)


def test_gpu_pool_from_memory_utilization():
    # ceil(80 GiB x 0.92) - 16 GiB weights - 4 GiB profiled activations
    pool = predict_engine_pool(
        get_preset("llama-3.1-8b"),
        "vllm",
        max_model_len=32768,
        device_memory_bytes=80 * GIB,
        weights_bytes=16 * GIB,
        activation_bytes=4 * GIB,
    )
    expected = -(-int(80 * GIB * 0.92 * 4) // 4) - 20 * GIB
    assert abs(pool.pool_bytes - expected) <= 1
    # 32 layers x 16 x 8 x 256 x 2 = 2 MiB a block; 2,048 blocks a 32K request
    assert pool.bytes_per_block == 2 * 2**20
    assert pool.num_blocks == pool.pool_bytes // (2 * 2**20)


def test_tensor_parallel_splits_heads_and_replicates_mla():
    llama = get_preset("llama-3.1-8b")
    one = predict_engine_pool(llama, "vllm", kv_cache_bytes=GIB, max_model_len=4096)
    two = predict_engine_pool(llama, "vllm", kv_cache_bytes=GIB, max_model_len=4096, tp=2)
    assert two.bytes_per_block * 2 == one.bytes_per_block
    ds = get_preset("deepseek-v3")
    a = predict_engine_pool(ds, "vllm", kv_cache_bytes=GIB, max_model_len=4096)
    b = predict_engine_pool(ds, "vllm", kv_cache_bytes=GIB, max_model_len=4096, tp=8)
    # one latent of 512 + 64 per token on every rank: 61 x 16 x 576 x 2 bytes a block
    assert a.bytes_per_block == b.bytes_per_block == 61 * 16 * 576 * 2


def test_a_pool_too_small_for_one_request_is_a_refusal_with_the_length_that_fits():
    pool = cpu_vllm(SMOL, 20 * 2**20, 8192)  # 7 blocks; one request needs 64 plus a null
    assert pool.requests == 0
    assert pool.refusal is not None
    assert "refuse to start" in pool.refusal
    assert "largest max_model_len that fits is 768" in pool.refusal  # 6 usable blocks x 128


def test_grouping_rules_on_unequal_counts():
    full = layer_spec(GEMMA.layers[5], 16, 1, 2)
    slide = layer_spec(GEMMA.layers[0], 16, 1, 2)
    # 12 sliding + 13 full: 13 < 1.5 x 12, so groups of 13: one sliding group padded
    groups = group_layers([slide] * 12 + [full] * 13)
    assert sorted(len(g) for g in groups) == [12, 13]
    # 20 sliding + 4 full: groups of 4, sliding dealt into 5 groups
    groups = group_layers([slide] * 20 + [full] * 4)
    assert sorted(len(g) for g in groups) == [4] * 6


# -- the ideal beside the engine ------------------------------------------------------------


def test_the_ideal_figure_and_the_overhead_in_bytes_and_requests():
    pool = cpu_vllm(GEMMA, GIB, 32768)
    # 3 globals x 32,768 x 1,024 bytes + 15 sliding x 512 x 1,024 bytes
    assert pool.ideal_bytes_per_request == 3 * 32768 * 1024 + 15 * 512 * 1024
    assert pool.bytes_per_request == 361 * 393_216
    assert pool.overhead_bytes_per_request == 361 * 393_216 - pool.ideal_bytes_per_request
    assert (pool.ideal_requests, pool.requests, pool.requests_lost) == (9, 7, 2)
    smol = cpu_vllm(SMOL, GIB, 4096)
    assert smol.overhead_bytes_per_request == 0
    assert smol.requests_lost == 0
    assert smol.unused_pool_bytes == GIB - 364 * 2_949_120


def test_to_dict_is_json_ready_and_names_its_sources():
    d = cpu_vllm(GEMMA, GIB, 32768).to_dict()
    assert d["num_blocks"] == 2_730 and d["basis"] == "from the engine's source"
    assert all("vllm/" in r["source"] for r in d["rules"])


# -- SGLang and llama.cpp, from their documentation ----------------------------------------


def test_sglang_token_pool_and_its_swa_split():
    llama = get_preset("llama-3.1-8b")
    pool = predict_engine_pool(llama, "sglang", kv_cache_bytes=GIB, max_model_len=4096)
    # cell = 32 layers x 8 heads x 128 x 2 x 2 bytes = 131,072: 8,192 tokens, 2 requests
    assert pool.kv_cache_tokens == 8192
    assert pool.max_concurrency == 2.0
    assert pool.basis == "from the engine's documentation, not measured here"
    g = predict_engine_pool(GEMMA, "sglang", kv_cache_bytes=GIB, max_model_len=32768)
    # 1 GiB / (18 x 1,024) = 58,254 tokens; x 18 layers / (0.8 x 15 + 3) = 69,904 full
    assert g.kv_cache_tokens == 69_904
    assert g.groups[1].blocks_per_request == 512


def test_llamacpp_allocates_n_ctx_for_its_slots_and_a_small_swa_cache():
    pool = predict_engine_pool(GEMMA, "llamacpp", max_model_len=32768, slots=4)
    # full: 131,072 cells x 3 layers x 1,024; sliding: 4 slots x pad(512 + 512, 256) cells
    assert pool.pool_bytes == 131_072 * 3 * 1024 + 4 * 1024 * 15 * 1024
    assert pool.requests == 4
    tight = predict_engine_pool(
        GEMMA, "llamacpp", max_model_len=32768, slots=4, kv_cache_bytes=GIB // 4
    )
    assert tight.refusal is not None and tight.requests == 0


# -- mistakes are one sentence ---------------------------------------------------------------


def test_unknown_engine_and_unmodeled_layers_are_one_sentence():
    assert engine_names() == ("vllm", "sglang", "llamacpp")
    with pytest.raises(CtxlabError, match="unknown engine 'tgi'"):
        predict_engine_pool(SMOL, "tgi", max_model_len=4096, kv_cache_bytes=GIB)
    with pytest.raises(CtxlabError, match="recurrent"):
        predict_engine_pool(
            get_preset("jamba-v0.1"), "vllm", max_model_len=4096, kv_cache_bytes=GIB
        )
    with pytest.raises(CtxlabError, match="VLLM_CPU_KVCACHE_SPACE"):
        predict_engine_pool(SMOL, "vllm", platform="cpu", max_model_len=4096)
    with pytest.raises(CtxlabError, match="positive whole number"):
        predict_engine_pool(SMOL, "vllm", max_model_len=0, kv_cache_bytes=GIB)
