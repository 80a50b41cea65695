"""Fixtures for the retrieval tests: the word-counting fake backend (shared with the memory
tests) and a store. The PDF writer is in `rag_pdf.py`: a helper imported by name must not live
in a conftest, which another folder's conftest shadows when both run in one command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "memory"))

from memory_fakes import WordBackend, real_backend, server  # noqa: F401  (fixtures)


@pytest.fixture
def word_backend() -> WordBackend:
    return WordBackend(window=4096)


@pytest.fixture
def store(tmp_path):
    from ctxlab.memory.store import open_store

    with open_store(tmp_path / "rag.db") as s:
        yield s
