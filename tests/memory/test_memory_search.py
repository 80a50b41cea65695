"""Search on a fixed corpus: BM25 order, cosine order, reciprocal rank fusion, filters, and
WordLlama loading from its wheel without touching the network."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from ctxlab.memory.embed import WordLlamaEmbedder, from_blobs, to_blob
from ctxlab.memory.messages import Message
from ctxlab.memory.recall import MESSAGES, RecallMemory
from ctxlab.memory.search import Hit, bm25, fts_query, reciprocal_rank_fusion, search

CORPUS = [
    ("user", "My bicycle has a flat tyre and the chain is rusty.", "2024-03-01T10:00:00"),
    ("assistant", "Patch the tyre first, then oil the chain.", "2024-03-01T10:01:00"),
    ("user", "The recipe needs two lemons and a cup of sugar.", "2024-03-08T09:00:00"),
    ("assistant", "Lemon curd keeps for a week in the fridge.", "2024-03-08T09:01:00"),
    ("user", "My flight number is QX2208 and it leaves at noon.", "2024-03-15T08:00:00"),
    ("assistant", "Arrive two hours early for an international flight.", "2024-03-15T08:01:00"),
]


@pytest.fixture
def recall(store):
    memory = RecallMemory(store, WordLlamaEmbedder(), "t")
    memory.add([Message(r, c, "s", d) for r, c, d in CORPUS])
    return memory


def test_fts_query_quotes_every_word_so_no_syntax_leaks():
    assert (
        fts_query('flight AND "number" NEAR(x') == '"flight" OR "and" OR "number" OR "near" OR "x"'
    )
    assert fts_query("?!") is None


def test_bm25_ranks_the_rarest_matching_words_first(recall):
    hits = bm25(recall.store.conn, MESSAGES, "flight number", 3)
    texts = [recall.get([h.rowid])[0].content for h in hits]
    assert texts[0].startswith("My flight number is QX2208")
    assert texts[1].startswith("Arrive two hours early")  # "flight" only
    assert len(hits) == 2  # nothing else contains either word
    assert hits[0].score > hits[1].score


def test_dense_and_hybrid_find_a_paraphrase(recall):
    found = recall.search("When does my plane depart?", 2, "dense")
    assert any("QX2208" in m.content for m in found)
    hybrid = recall.search("bike chain repair", 2, "hybrid")
    assert "bicycle" in hybrid[0].content or "chain" in hybrid[0].content


def test_reciprocal_rank_fusion_sums_inverse_ranks():
    a = [Hit(1, 9.0, 1), Hit(2, 8.0, 2), Hit(3, 7.0, 3)]
    b = [Hit(3, 0.9, 1), Hit(1, 0.8, 2)]
    fused = reciprocal_rank_fusion([a, b], 3)
    assert [h.rowid for h in fused] == [1, 3, 2]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 62)
    assert fused[1].score == pytest.approx(1 / 63 + 1 / 61)
    assert fused[2].score == pytest.approx(1 / 62)


def test_filters_by_role_date_and_exclusion(recall):
    users = recall.search("flight chain lemons", 10, "bm25", roles=["user"])
    assert {m.role for m in users} == {"user"}
    march_8 = recall.search("lemons lemon", 10, "bm25", start="2024-03-08", end="2024-03-08")
    assert [m.created_at[:10] for m in march_8] == ["2024-03-08"] * len(march_8)
    assert len(march_8) >= 1
    first = recall.search("flight", 1, "bm25")[0]
    rest = recall.search("flight", 5, "bm25", exclude=[first.id])
    assert first.id not in [m.id for m in rest]


def test_every_retriever_sees_the_same_candidates(recall):
    for name in ("bm25", "dense", "hybrid"):
        hits = recall.search("flight", 10, name, roles=["assistant"])
        assert {m.role for m in hits} <= {"assistant"}


def test_vectors_are_unit_float32_blobs():
    vectors = WordLlamaEmbedder().embed(["one text", "another text"])
    assert vectors.dtype == np.float32 and vectors.shape == (2, 256)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    back = from_blobs([to_blob(v) for v in vectors], 256)
    assert np.array_equal(back, vectors)


def test_wordllama_loads_from_the_wheel_without_network(monkeypatch):
    import requests

    from ctxlab.memory import embed

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(requests, "get", refuse)
    embed._load_wordllama.cache_clear()
    assert WordLlamaEmbedder().embed(["offline"]).shape == (1, 256)


def test_search_without_an_embedder_needs_bm25(store):
    from ctxlab.errors import CtxlabError

    with pytest.raises(CtxlabError, match="needs an embedder"):
        search(store.conn, MESSAGES, "x", 1, "dense", None)
    with pytest.raises(CtxlabError, match="unknown"):
        search(store.conn, MESSAGES, "x", 1, "sparse", None)
