"""Fixtures for the peer tests: the in-process CLI (tests/cli) and a small RAG store."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.cli.conftest import cli  # noqa: F401 (fixture)

sys.path.insert(0, str(Path(__file__).parents[1] / "memory"))


@pytest.fixture(scope="session")
def rag_db(tmp_path_factory) -> Path:
    """A store with one ingested document, so `rag ask` has something to retrieve."""
    from memory_fakes import WordBackend

    from ctxlab.memory.embed import WordLlamaEmbedder
    from ctxlab.memory.store import open_store
    from ctxlab.rag.documents import ingest
    from ctxlab.rag.readers import SourceDoc

    db = tmp_path_factory.mktemp("rag") / "rag.db"
    with open_store(db) as store:
        doc = SourceDoc("acme", "Acme Foundry is led by Ada Stone.", "2020-01-01", "Acme", "a1")
        ingest(store, doc, WordBackend(), WordLlamaEmbedder(), 64, 4)
    return db
