"""Fixtures for the memory tests: a word-counting fake backend, a store, the real tokenizer.

Tests that need the real tokenizer use `real_backend` (the default model's tokenizer and
chat template, over the session's shared model).
"""

from __future__ import annotations

import pytest
from memory_fakes import WordBackend, real_backend, server  # noqa: F401  (fixtures)


@pytest.fixture
def word_backend() -> WordBackend:
    return WordBackend()


@pytest.fixture
def store(tmp_path):
    from ctxlab.memory.store import open_store

    with open_store(tmp_path / "memory.db") as s:
        yield s
