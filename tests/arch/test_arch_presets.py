"""Presets reproduce the published cache figures of issue 2 and the shapes of their sources."""

from __future__ import annotations

import pytest

from ctxlab.arch import ArchSpec, LayerSpec, get_preset, list_presets, uniform_layers
from ctxlab.errors import CtxlabError

KIB, MIB, GIB = 1024, 1024**2, 1024**3

EXPECTED_PRESETS = {
    "smollm2-135m",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "llama-2-7b",
    "mistral-7b-v0.1",
    "mixtral-8x7b",
    "gemma-3-270m",
    "gemma-3-27b",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "deepseek-v3",
    "qwen3-8b",
    "jamba-v0.1",
    "kimi-linear-48b-a3b",
}


def test_every_required_preset_is_listed_with_a_source() -> None:
    rows = list_presets()
    assert {name for name, _, _ in rows} == EXPECTED_PRESETS
    for name, source, description in rows:
        assert "huggingface.co/" in source or "arXiv" in source, name
        assert description
        assert get_preset(name).source == source


def test_unknown_preset_lists_known_names() -> None:
    with pytest.raises(CtxlabError) as err:
        get_preset("llama-9")
    message = str(err.value)
    assert "llama-9" in message
    assert "llama-3.1-8b" in message and "gemma-3-27b" in message


def test_preset_lookup_ignores_case_and_spaces() -> None:
    assert get_preset("  Llama-3.1-8B ").name == "llama-3.1-8b"


# -- published figures ---------------------------------------------------------------------


def test_llama_31_8b_128_kib_per_token_and_16_gib_per_128k_request() -> None:
    arch = get_preset("llama-3.1-8b")
    assert arch.kv_bytes_per_token() == 131_072 == 128 * KIB
    assert arch.request_bytes(131_072) == 16 * GIB
    assert 8 * arch.request_bytes(131_072) == 128 * GIB
    assert arch.params == 8_030_261_248


def test_llama_31_8b_8bit_cache_halves_17_2_gb() -> None:
    arch = get_preset("llama-3.1-8b")
    full = arch.request_bytes(131_072)
    assert round(full / 1e9, 1) == 17.2
    assert round(arch.with_cache_dtype(1).request_bytes(131_072) / 1e9, 1) == 8.6


def test_gemma_3_27b_all_global_62_gib_vs_10_4_gib_as_built() -> None:
    arch = get_preset("gemma-3-27b")
    assert round(arch.all_global().request_bytes(131_072) / GIB, 1) == 62.0
    assert round(arch.request_bytes(131_072) / GIB, 1) == 10.4


def test_gemma_3_27b_global_layers_are_every_sixth() -> None:
    arch = get_preset("gemma-3-27b")
    assert arch.n_layers == 62
    assert arch.layer_indices("full") == tuple(range(5, 62, 6))
    assert len(arch.layer_indices("sliding")) == 52
    for layer in arch.layers:
        assert (layer.kv_heads, layer.d_k, layer.d_v) == (16, 128, 128)
        if layer.kind == "sliding":
            assert layer.window == 1024


def test_mistral_stops_growing_at_4096_tokens_512_mib() -> None:
    arch = get_preset("mistral-7b-v0.1")
    assert all(layer.kind == "sliding" and layer.window == 4096 for layer in arch.layers)
    assert arch.request_bytes(4096) == 512 * MIB
    assert arch.request_bytes(4095) < 512 * MIB
    assert arch.request_bytes(131_072) == 512 * MIB
    assert arch.request_bytes(1_000_000) == 512 * MIB


def test_deepseek_v3_mla_ratio_against_mha_of_same_dims() -> None:
    arch = get_preset("deepseek-v3")
    assert arch.n_layers == 61
    mla = arch.layers[0]
    assert (mla.kind, mla.d_c, mla.d_rope, mla.d_k, mla.d_v) == ("mla", 512, 64, 192, 128)
    h_q = arch.n_query_heads
    assert h_q == 128
    mha = ArchSpec(
        name="deepseek-v3 as MHA",
        layers=uniform_layers(61, LayerSpec("full", kv_heads=h_q, d_k=192, d_v=128)),
        n_query_heads=h_q,
        hidden_size=arch.hidden_size,
        params=arch.params,
    )
    ratio = arch.kv_bytes_per_token() / mha.kv_bytes_per_token()
    assert ratio == (512 + 64) / (h_q * (192 + 128))
    assert arch.kv_bytes_per_token() == 61 * 576 * 2  # no factor 2: one latent, no V
    assert (arch.params, arch.active_params) == (671_000_000_000, 37_000_000_000)


def test_llama_2_7b_is_mha() -> None:
    arch = get_preset("llama-2-7b")
    assert all(layer.kv_heads == arch.n_query_heads == 32 for layer in arch.layers)
    assert arch.kv_bytes_per_token() == 32 * 2 * 32 * 128 * 2  # 512 KiB


def test_mixtral_counts_total_and_active_parameters() -> None:
    arch = get_preset("mixtral-8x7b")
    assert arch.params == 46_702_792_704
    assert arch.active_params == 12_879_925_248
    assert arch.flops_params == arch.active_params


@pytest.mark.parametrize(("name", "n_layers"), [("gpt-oss-120b", 36), ("gpt-oss-20b", 24)])
def test_gpt_oss_banded_window_on_alternate_layers(name: str, n_layers: int) -> None:
    arch = get_preset(name)
    assert arch.n_layers == n_layers
    assert arch.n_query_heads == 64
    assert arch.layer_indices("sliding") == tuple(range(0, n_layers, 2))
    assert arch.layer_indices("full") == tuple(range(1, n_layers, 2))
    for layer in arch.layers:
        assert (layer.kv_heads, layer.d_k, layer.d_v) == (8, 64, 64)
    # Past the window only the global half keeps growing.
    per_layer = 8 * 128 * 2
    assert arch.request_bytes(10_000) == (n_layers // 2) * per_layer * (10_000 + 128)


def test_qwen3_8b_has_no_sliding_layers() -> None:
    arch = get_preset("qwen3-8b")
    assert arch.kind_counts() == {"full": 36}
    assert arch.kv_bytes_per_token() == 36 * 8 * 256 * 2


def test_jamba_fixed_state_by_mamba_formula() -> None:
    arch = get_preset("jamba-v0.1")
    assert arch.layer_indices("full") == (4, 12, 20, 28)
    assert len(arch.layer_indices("recurrent")) == 28
    d_inner = 2 * 4096
    per_layer = d_inner * 16 + d_inner * (4 - 1)  # SSM state + conv tail
    assert arch.fixed_state_bytes() == 28 * per_layer * 2
    assert arch.kv_bytes_per_token() == 4 * 8 * 256 * 2
    assert arch.request_bytes(0) == arch.fixed_state_bytes()
    assert (arch.params, arch.active_params) == (52_000_000_000, 12_000_000_000)


def test_kimi_linear_mla_layers_and_kda_state() -> None:
    arch = get_preset("kimi-linear-48b-a3b")
    assert arch.n_layers == 27
    assert arch.layer_indices("mla") == (3, 7, 11, 15, 19, 23, 26)
    assert len(arch.layer_indices("recurrent")) == 20
    assert arch.fixed_state_bytes() == 20 * 32 * 128 * 128 * 2
    assert arch.kv_bytes_per_token() == 7 * (512 + 64) * 2


def test_every_preset_is_consistent() -> None:
    for name, _, _ in list_presets():
        arch = get_preset(name)
        assert arch.name == name
        assert arch.params > 0 and arch.n_layers > 0
        assert arch.active_params is None or 0 < arch.active_params < arch.params
        assert arch.request_bytes(0) == arch.fixed_state_bytes()
        assert arch.max_position > 0 and arch.vocab_size > 0
