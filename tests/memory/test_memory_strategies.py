"""Each strategy at its eviction boundary: what leaves, what note replaces it, what returns."""

from __future__ import annotations

from memory_fakes import WordBackend

from ctxlab.memory.agent import MemoryAgent
from ctxlab.memory.backend import text_tokens
from ctxlab.memory.budget import MemoryConfig
from ctxlab.memory.embed import WordLlamaEmbedder
from ctxlab.memory.messages import Message
from ctxlab.memory.strategies import STRATEGIES, make_strategy
from ctxlab.memory.strategies.summary import RecursiveSummary
from ctxlab.memory.summarizers import ModelSummarizer


def filler_turns(n: int, start: int = 0) -> list[Message]:
    out = []
    for t in range(start, start + n):
        out.append(Message("user", f"Tell me about topic {t} in a few words please okay"))
        out.append(Message("assistant", f"Topic {t} is a broad subject with many sides to it"))
    return out


FACT = Message("user", "My locker code is 4417 and my cat is called Pemberly.")


def agent_for(backend, store, strategy, window=220, **kw):
    cfg = MemoryConfig(window=window, reserve=20, retrieve_k=2, **kw)
    return MemoryAgent(backend, strategy, store, cfg, embedder=WordLlamaEmbedder())


def test_every_registered_strategy_keeps_the_budget(store):
    for name in STRATEGIES:
        backend = WordBackend(window=220, answer=lambda chat: "a short summary of it")
        agent = agent_for(backend, store, name)
        agent.recall.agent = agent.core.agent = name
        for m in [FACT, Message("assistant", "Noted."), *filler_turns(15)]:
            agent.observe(m)
            assert agent.tokens() <= agent.config.budget
        assert agent.state.evicted_total > 0
        assert backend.count_tokens(agent.preview("What is my locker code?")) <= 200


def test_truncation_drops_and_writes_no_note(word_backend, store):
    agent = agent_for(word_backend, store, "truncation")
    agent.observe([FACT, Message("assistant", "Noted."), *filler_turns(15)])
    assert agent.state.note == ""
    assert all("4417" not in m.content for m in agent.state.messages)
    assert word_backend.calls == []  # truncation never asks the model


def test_model_summary_is_recursive(store):
    seen: list[str] = []

    def summarize(chat):
        seen.append(chat[-1]["content"])
        return f"summary number {len(seen)} keeps 4417"

    backend = WordBackend(window=220, answer=summarize)
    agent = agent_for(backend, store, RecursiveSummary(ModelSummarizer(), summary_tokens=24))
    agent.observe([FACT, Message("assistant", "Noted."), *filler_turns(20)])
    assert len(seen) >= 2
    assert "4417" in seen[0]  # the evicted fact went to the summarizer
    assert "Summary so far:\nsummary number 1" in seen[1]  # and the summary was re-summarised
    assert agent.state.note.endswith(f"summary number {len(seen)} keeps 4417")
    assert "written by the model" in agent.state.note


def test_extractive_summary_keeps_the_fact_sentence_within_its_tokens(word_backend, store):
    strategy = make_strategy("summary-extractive")
    agent = agent_for(word_backend, store, strategy)
    agent.observe([FACT, Message("assistant", "Noted."), *filler_turns(15)])
    assert "4417" in agent.state.note and "Pemberly" in agent.state.note
    assert "extractive" in agent.state.note
    assert text_tokens(word_backend, strategy.summary) <= strategy.summary_tokens
    assert word_backend.calls == []  # no model involved


def test_tiered_archives_with_a_note_and_recalls_by_the_users_turn(word_backend, store):
    agent = agent_for(word_backend, store, "tiered")
    agent.observe([FACT, Message("assistant", "Noted."), *filler_turns(15)])
    assert "Recall memory holds" in agent.state.note
    assert all("4417" not in m.content for m in agent.state.messages)
    agent.observe(Message("user", "What is my locker code again?"))
    chat = agent.prepare()
    assert any("4417" in m.content for m in agent.state.retrieved)
    in_context = {m.id for m in agent.state.messages}
    assert not in_context & {m.id for m in agent.state.retrieved}
    recalled = next(i for i, m in enumerate(chat) if "Earlier messages" in m["content"])
    assert recalled == len(chat) - 2  # right before the user's turn
    assert word_backend.count_tokens(chat) <= agent.config.budget


def test_recalled_messages_are_cut_to_the_budget(store):
    backend = WordBackend(window=220)
    agent = agent_for(backend, store, "tiered", window=220)
    agent.config = MemoryConfig(window=220, reserve=20, retrieve_k=50)
    agent.env.config = agent.config
    agent.observe([FACT, Message("assistant", "Noted."), *filler_turns(15)])
    agent.observe(Message("user", "topic subject sides words"))
    chat = agent.prepare()
    assert 0 < len(agent.state.retrieved) < 50
    assert backend.count_tokens(chat) <= agent.config.budget


def test_respond_records_both_sides(store):
    backend = WordBackend(window=400, answer=lambda chat: "Your code is 4417.")
    agent = agent_for(backend, store, "tiered", window=400)
    reply = agent.respond("Remember: my locker code is 4417.", max_tokens=8)
    assert reply.text == "Your code is 4417."
    assert [m.role for m in agent.recall.get_all()] == ["user", "assistant"]


def test_note_can_sit_next_to_the_users_turn(word_backend, store):
    cfg = MemoryConfig(window=220, reserve=20, note_position="turn")
    agent = MemoryAgent(word_backend, "summary-extractive", store, cfg, embedder=None)
    agent.observe([FACT, Message("assistant", "Noted."), *filler_turns(15)])
    agent.observe(Message("user", "What is my locker code?"))
    chat = agent.prepare()
    assert "4417" not in chat[0]["content"]  # not in the system message
    assert "4417" in chat[-2]["content"] and chat[-2]["role"] == "system"
    assert chat[-1]["content"] == "What is my locker code?"
    assert word_backend.count_tokens(chat) <= cfg.budget
