"""The config.json reader: fixtures give the presets' shapes, and the known traps hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxlab.arch import from_hf_config, get_preset
from ctxlab.errors import CtxlabError

FIXTURES = Path(__file__).parent / "fixtures"
GIB = 1024**3


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.mark.parametrize(
    "name",
    [
        "smollm2-135m",
        "llama-3.1-8b",
        "mistral-7b-v0.1",
        "mixtral-8x7b",
        "gemma-3-27b",
        "gpt-oss-120b",
        "deepseek-v3",
        "qwen3-8b",
        "jamba-v0.1",
        "kimi-linear-48b-a3b",
    ],
)
def test_config_gives_the_same_layers_as_the_preset(name: str) -> None:
    spec = from_hf_config(FIXTURES / f"{name}.json")
    preset = get_preset(name)
    assert spec.layers == preset.layers
    assert spec.n_query_heads == preset.n_query_heads
    assert spec.hidden_size == preset.hidden_size
    assert spec.vocab_size == preset.vocab_size
    assert spec.name == name
    assert any("estimate" in note for note in spec.notes)


@pytest.mark.parametrize(
    "name", ["smollm2-135m", "llama-3.1-8b", "mistral-7b-v0.1", "mixtral-8x7b", "qwen3-8b"]
)
def test_parameter_estimate_is_exact_for_dense_and_mixtral(name: str) -> None:
    spec = from_hf_config(FIXTURES / f"{name}.json")
    preset = get_preset(name)
    assert spec.params == preset.params
    assert spec.active_params == preset.active_params


@pytest.mark.parametrize(
    ("name", "total", "active", "tolerance"),
    [
        ("deepseek-v3", 671e9, 37e9, 0.02),
        ("jamba-v0.1", 52e9, 12e9, 0.02),
        # Gemma 3 report, table 1: 417M vision encoder + 1,416M embedding + 25,600M
        # non-embedding = 27.43B in all; the text decoder alone is what a token runs through
        ("gemma-3-27b", 27.43e9, 27.0e9, 0.01),
        ("gpt-oss-120b", 116.83e9, None, 0.01),
        ("kimi-linear-48b-a3b", 48e9, None, 0.05),
    ],
)
def test_parameter_estimate_is_near_the_published_total(
    name: str, total: float, active: float | None, tolerance: float
) -> None:
    spec = from_hf_config(FIXTURES / f"{name}.json")
    assert abs(spec.params - total) / total < tolerance
    if active is not None:
        assert spec.active_params is not None
        assert abs(spec.active_params - active) / active < tolerance


def test_gpt_oss_active_parameters_route_four_of_128_experts() -> None:
    spec = from_hf_config(FIXTURES / "gpt-oss-120b.json")
    expert = 3 * 2880 * 2880
    assert spec.active_params == spec.params - 36 * (128 - 4) * expert


# -- traps -----------------------------------------------------------------------------------


def test_qwen_use_sliding_window_false_means_no_sliding() -> None:
    cfg = load("qwen2.5-7b-instruct")
    assert cfg["sliding_window"] == 131072 and cfg["use_sliding_window"] is False
    spec = from_hf_config(cfg)
    assert spec.kind_counts() == {"full": 28}
    assert any("sliding_window" in note for note in spec.notes)
    # The same trap on a Qwen3 config carrying a window value.
    qwen3 = dict(load("qwen3-8b"), sliding_window=4096)
    assert from_hf_config(qwen3).kind_counts() == {"full": 36}
    # Switched on, Qwen2 slides from max_window_layers upward.
    on = dict(cfg, use_sliding_window=True, sliding_window=4096, max_window_layers=20)
    spec_on = from_hf_config(on)
    assert spec_on.layer_indices("sliding") == tuple(range(20, 28))


def test_head_dim_is_read_not_derived() -> None:
    qwen = from_hf_config(FIXTURES / "qwen3-0.6b.json")  # hidden/heads would be 64
    assert {layer.d_k for layer in qwen.layers} == {128}
    assert qwen.kv_bytes_per_token() == 28 * 8 * 256 * 2
    gemma = from_hf_config(FIXTURES / "gemma-3-27b.json")  # hidden/heads would be 168
    assert {layer.d_k for layer in gemma.layers} == {128}


def test_head_dim_falls_back_only_when_absent_or_null() -> None:
    cfg = load("llama-3.1-8b")
    assert "head_dim" not in cfg
    assert from_hf_config(cfg).layers[0].d_k == 4096 // 32
    assert from_hf_config(dict(cfg, head_dim=None)).layers[0].d_k == 128
    assert from_hf_config(dict(cfg, head_dim=64)).layers[0].d_k == 64


def test_kv_heads_default_to_query_heads() -> None:
    cfg = load("llama-3.1-8b")
    del cfg["num_key_value_heads"]
    assert from_hf_config(cfg).layers[0].kv_heads == 32


def test_gemma_text_config_nesting_and_built_figures() -> None:
    spec = from_hf_config(FIXTURES / "gemma-3-27b.json")
    assert spec.n_layers == 62
    assert spec.layer_indices("full") == tuple(range(5, 62, 6))
    assert round(spec.request_bytes(131_072) / GIB, 1) == 10.4
    assert round(spec.all_global().request_bytes(131_072) / GIB, 1) == 62.0


def test_gemma_pattern_defaults_to_six_when_the_key_is_absent() -> None:
    cfg = load("gemma-3-27b")
    del cfg["text_config"]["sliding_window_pattern"]
    assert from_hf_config(cfg).layer_indices("full") == tuple(range(5, 62, 6))


def test_layer_types_win_over_the_pattern() -> None:
    cfg = load("gemma-3-27b")
    types = ["full_attention" if i < 2 else "sliding_attention" for i in range(62)]
    cfg["text_config"]["layer_types"] = types
    assert from_hf_config(cfg).layer_indices("full") == (0, 1)


def test_mistral_slides_in_every_layer() -> None:
    spec = from_hf_config(FIXTURES / "mistral-7b-v0.1.json")
    assert spec.kind_counts() == {"sliding(window=4096)": 32}
    assert spec.request_bytes(200_000) == 512 * 1024**2


def test_jamba_period_and_offset() -> None:
    spec = from_hf_config(FIXTURES / "jamba-v0.1.json")
    assert spec.layer_indices("full") == (4, 12, 20, 28)
    shifted = from_hf_config(dict(load("jamba-v0.1"), attn_layer_offset=0))
    assert shifted.layer_indices("full") == (0, 8, 16, 24)


def test_mla_reads_latent_and_rope_width() -> None:
    spec = from_hf_config(FIXTURES / "deepseek-v3.json")
    layer = spec.layers[0]
    assert (layer.kind, layer.d_c, layer.d_rope, layer.d_k, layer.d_v) == (
        "mla",
        512,
        64,
        192,
        128,
    )


def test_kimi_full_attention_layers_count_from_one() -> None:
    spec = from_hf_config(FIXTURES / "kimi-linear-48b-a3b.json")
    assert spec.layer_indices("mla") == (3, 7, 11, 15, 19, 23, 26)
    assert spec.fixed_state_bytes() == 20 * 32 * 128 * 128 * 2


def test_linear_attention_layer_types() -> None:
    cfg = {
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
    }
    spec = from_hf_config(cfg)
    assert spec.layer_indices("recurrent") == (0, 1, 2)
    assert spec.fixed_state_bytes() == 3 * 8 * 32 * 16 * 2


def test_folder_with_config_json_is_accepted(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text((FIXTURES / "llama-3.1-8b.json").read_text())
    spec = from_hf_config(folder)
    assert spec.name == "my-model"
    assert spec.kv_bytes_per_token() == 131_072
    assert from_hf_config(folder, name="custom").name == "custom"


# -- bad input ------------------------------------------------------------------------------


def _write(tmp_path: Path, cfg: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda c: c.pop("num_hidden_layers"), "num_hidden_layers"),
        (lambda c: c.update(num_attention_heads=0), "num_attention_heads"),
        (lambda c: c.update(num_key_value_heads="eight"), "num_key_value_heads"),
        (lambda c: c.update(head_dim=-1), "head_dim"),
        (lambda c: c.update(hidden_size=4095, head_dim=None), "head_dim"),
        (lambda c: c.update(layer_types=["full_attention"] * 3), "layer_types"),
        (lambda c: c.update(layer_types=["chunky"] * 32), "layer_types"),
        (lambda c: c.update(layer_types=["sliding_attention"] * 32), "sliding_window"),
        (lambda c: c.update(sliding_window=0), "sliding_window"),
        (lambda c: c.update(attn_layer_period=8, attn_layer_offset=8), "attn_layer_offset"),
        (lambda c: c.update(use_sliding_window="no", sliding_window=4096), "use_sliding_window"),
        (lambda c: c.update(text_config=[1, 2]), "text_config"),
    ],
)
def test_bad_field_is_named_with_the_file(tmp_path: Path, mutate, field: str) -> None:
    cfg = load("llama-3.1-8b")
    mutate(cfg)
    path = _write(tmp_path, cfg)
    with pytest.raises(CtxlabError) as err:
        from_hf_config(path)
    assert str(path) in str(err.value)
    assert repr(field) in str(err.value)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(CtxlabError, match=r"nope\.json does not exist"):
        from_hf_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(CtxlabError, match=r"bad\.json.*not valid JSON"):
        from_hf_config(bad)
    with pytest.raises(CtxlabError, match="JSON object"):
        from_hf_config(_write(tmp_path, [1, 2, 3]))


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "heads", "kv", "inter", "vocab"),
    [
        ("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256),
        ("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256),
        ("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
    ],
)
def test_estimate_reproduces_published_llama_counts(
    name: str, layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int
) -> None:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
    }
    spec = from_hf_config(cfg)
    preset = get_preset(name)
    assert spec.params == preset.params
    assert spec.layers == preset.layers
