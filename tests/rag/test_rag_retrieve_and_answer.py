"""Retrieval over a fixed corpus (newest version wins, as-of dates, ordering) and answers
with citations, model-written or attributed."""

from __future__ import annotations

import pytest
from memory_fakes import WordBackend

from ctxlab.errors import CtxlabError
from ctxlab.memory.embed import WordLlamaEmbedder
from ctxlab.rag.answer import (
    about_versions,
    answer_chat,
    attributed_citations,
    cite,
    model_citations,
)
from ctxlab.rag.ask import ask
from ctxlab.rag.documents import ingest
from ctxlab.rag.readers import SourceDoc
from ctxlab.rag.retriever import CorpusRetriever, Passage, order_passages

DOCS = [
    SourceDoc(
        "acme",
        "Acme Foundry is led by Ada Stone. It casts brass valves.",
        "2020-01-01",
        "Acme",
        "a1",
    ),
    SourceDoc(
        "bolt", "Bolt Press prints railway timetables in Quellby.", "2020-02-01", "Bolt", "b1"
    ),
    SourceDoc(
        "acme", "Acme Foundry is led by Bo Reed. It casts brass valves.", "2023-05-01", "Acme", "a2"
    ),
    SourceDoc(
        "news", "Ada Stone will stay on as the leader of Acme Foundry.", "2021-06-01", "News", "n1"
    ),
]


@pytest.fixture
def corpus(store):
    emb = WordLlamaEmbedder()
    for d in DOCS:
        ingest(store, d, WordBackend(), emb, 64, 4)
    return CorpusRetriever(store, emb)


def test_newest_version_only_and_as_of(corpus):
    keys = {(p.doc_id, p.version) for p in corpus.search("Who leads Acme Foundry?", 5, "bm25")}
    assert ("acme", 2) in keys and ("acme", 1) not in keys
    past = corpus.search("Who leads Acme Foundry?", 5, "bm25", as_of="2021-01-01")
    assert ("acme", 1) in {(p.doc_id, p.version) for p in past}
    assert "news" not in {p.doc_id for p in past}  # dated after the as-of day
    every = corpus.search("Acme Foundry", 10, "bm25", all_versions=True)
    assert {("acme", 1), ("acme", 2)} <= {(p.doc_id, p.version) for p in every}


def test_ranking_on_the_fixed_corpus(corpus):
    top = corpus.search("railway timetables", 1, "bm25")[0]
    assert top.key == "bolt#0"
    assert corpus.search("railway timetables", 1, "hybrid")[0].key == "bolt#0"
    ranks = [p.rank for p in corpus.search("Acme Foundry leader", 3, "dense")]
    assert ranks == [1, 2, 3]


def p(rank: int) -> Passage:
    return Passage(f"d{rank}", 1, "2024-01-01", 0, "t", "T", 1.0 / rank, rank)


def test_edges_order_puts_the_best_at_both_ends():
    got = [x.rank for x in order_passages([p(r) for r in (3, 1, 5, 2, 4)], "edges")]
    assert got == [1, 3, 5, 4, 2]
    assert [x.rank for x in order_passages([p(2), p(1)], "relevance")] == [1, 2]
    with pytest.raises(CtxlabError):
        order_passages([], "random")


def test_model_citations_must_name_given_passages():
    given = [Passage("acme", 2, "d", 0, "Acme is led by Bo Reed.", "A", 1, 1)]
    assert model_citations("Bo Reed [acme#0] [ghost#3] [acme#0]", given) == ["acme#0"]
    assert model_citations("Bo Reed [acme#0, 2023-05-01]", given) == ["acme#0"]
    assert cite("Bo Reed [acme#0]", "q", given) == (["acme#0"], "model")


def test_attributed_citations_use_answer_words_not_question_words():
    given = [
        Passage("acme", 2, "d", 0, "Acme Foundry is led by Bo Reed.", "A", 1, 1),
        Passage("news", 1, "d", 0, "Ada Stone leads Acme Foundry.", "N", 1, 2),
    ]
    q = "Who leads Acme Foundry?"
    assert attributed_citations("Acme Foundry is led by Bo Reed.", q, given) == ["acme#0"]
    assert cite("I am not sure.", q, given) == ([], "none")
    chat = answer_chat(q, given)
    assert "Acme Foundry is led by Bo Reed. [acme#0]" in chat[1]["content"]  # no date asked
    assert "newest date" not in chat[0]["content"]
    dated = answer_chat(q, given, "always")
    assert "Acme Foundry is led by Bo Reed. [acme#0, d]" in dated[1]["content"]
    assert "newest date" in dated[0]["content"]


@pytest.mark.parametrize(
    ("question", "dated"),
    [
        ("Who leads Acme Foundry now?", True),
        ("What is the latest version of the plan?", True),
        ("Who was the director as of 2021?", True),
        ("Has the head count changed?", True),
        ("In which year was Acme Foundry founded?", False),  # a year, not a version
        ("When was Acme Foundry founded?", False),
        ("Who leads Acme Foundry?", False),
    ],
)
def test_dates_only_for_questions_about_versions(question, dated):
    given = [Passage("acme", 2, "2023-04-05", 0, "Acme Foundry is led by Bo Reed.", "A", 1, 1)]
    assert about_versions(question) is dated
    assert ("2023-04-05" in answer_chat(question, given)[1]["content"]) is dated
    assert "2023-04-05" not in answer_chat(question, given, "never")[1]["content"]
    with pytest.raises(CtxlabError):
        answer_chat(question, given, "sometimes")


def test_ask_answers_from_the_newest_version_and_cites_it(corpus):
    def answer(chat):
        text = chat[-1]["content"]
        return "Bo Reed." if "Bo Reed" in text else "Ada Stone."

    got = ask(
        WordBackend(answer=answer),
        corpus.store,
        "Who leads Acme Foundry?",
        k=2,
        retriever="bm25",
        embedder=corpus.embedder,
    )
    assert got.text == "Bo Reed." and got.citations == ["acme#0"]
    assert got.cited_by == "attributed"
    assert all(p.version == 2 for p in got.passages if p.doc_id == "acme")


def test_ask_an_empty_store_is_one_sentence(store):
    with pytest.raises(CtxlabError, match="holds no documents"):
        ask(WordBackend(), store, "anything?")


def test_ask_times_each_phase_and_loads_a_lazy_backend_before_the_call(corpus):
    """`Answer.seconds` splits retrieval, model load and model call; a backend that loads
    lazily is loaded before its call (so the load is never counted as the call), once."""
    events: list[str] = []

    class LazyBackend(WordBackend):
        def load(self) -> None:
            events.append("load")

        def generate(self, chats, max_tokens):
            events.append("generate")
            return super().generate(chats, max_tokens)

    got = ask(LazyBackend(), corpus.store, "Who leads Acme Foundry?", k=2, retriever="bm25")
    assert events == ["load", "generate"]
    assert set(got.seconds) == {"retrieval", "model_load", "model_call"}
    assert all(s >= 0 for s in got.seconds.values())
    plain = ask(WordBackend(), corpus.store, "Who leads Acme Foundry?", k=2, retriever="bm25")
    assert set(plain.seconds) == {"retrieval", "model_load", "model_call"}
