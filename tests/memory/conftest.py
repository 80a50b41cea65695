"""Fixtures for the memory tests: a word-counting fake backend, a store, the real tokenizer.

Tests that need the real tokenizer use `real_backend` (the default model's tokenizer and
chat template; the weights never load because these tests do not generate).
"""

from __future__ import annotations

import pytest
from memory_fakes import WordBackend


@pytest.fixture
def word_backend() -> WordBackend:
    return WordBackend()


@pytest.fixture
def store(tmp_path):
    from ctxlab.memory.store import open_store

    with open_store(tmp_path / "memory.db") as s:
        yield s


@pytest.fixture(scope="session")
def real_backend(gguf_path):
    """The default model's tokenizer and chat template behind the Backend protocol."""
    from ctxlab.memory.engine_backend import EngineBackend

    return EngineBackend(str(gguf_path), context_window=8192)
