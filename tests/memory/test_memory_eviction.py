"""Pressure and eviction: a warning at 75 %, compaction at 90 %, a cut that starts at the
oldest 30 %, grows by 10 % until the rest fits in 70 %, and lands only on turn starts."""

from __future__ import annotations

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.memory.agent import MemoryAgent
from ctxlab.memory.budget import MemoryConfig
from ctxlab.memory.eviction import choose_cut
from ctxlab.memory.messages import Message, turn_starts


def convo(turns: int, words: int = 10) -> list[Message]:
    out = []
    for t in range(turns):
        out.append(Message("user", " ".join([f"u{t}"] * words)))
        out.append(Message("assistant", " ".join([f"a{t}"] * words)))
    return out


def test_turn_starts_are_user_messages():
    msgs = [Message("assistant", "hi"), *convo(2)]
    assert turn_starts(msgs) == [0, 1, 3]


def test_cut_starts_at_30_percent_on_a_turn_boundary():
    msgs = convo(10)  # 20 messages, turns start at even indices
    asked = []
    cut, share = choose_cut(msgs, lambda c: asked.append(c) or True)
    assert (cut, share) == (6, pytest.approx(0.3))
    assert asked == [6]


def test_cut_moves_forward_to_the_next_turn_start():
    msgs = [Message("user", "q"), *[Message("assistant", "a")] * 8, Message("user", "q2")]
    msgs += [Message("assistant", "b")]
    cut, _ = choose_cut(msgs, lambda c: True)  # 30 % of 11 = 4, inside the first turn
    assert cut == 9


def test_cut_grows_by_ten_percent_until_it_fits():
    msgs = convo(10)
    asked = []
    cut, share = choose_cut(msgs, lambda c: asked.append(c) or c >= 12)
    assert asked == [6, 8, 10, 12]
    assert cut == 12 and share == pytest.approx(0.6)


def test_the_newest_turn_is_never_cut():
    msgs = convo(3)
    cut, _ = choose_cut(msgs, lambda c: False)
    assert cut == 4 and msgs[cut].role == "user"
    assert choose_cut(convo(1), lambda c: False) == (0, 0.0)


def make_agent(word_backend, store, strategy="truncation", window=200, reserve=20, **kw):
    cfg = MemoryConfig(window=window, reserve=reserve, **kw)
    return MemoryAgent(word_backend, strategy, store, cfg, embedder=None, retriever="bm25")


def test_warning_then_compaction_at_the_thresholds(word_backend, store):
    agent = make_agent(word_backend, store)
    budget = agent.config.budget
    kinds = []
    for m in convo(20):
        before = agent.tokens()
        for e in agent.observe(m):
            kinds.append(e.kind)
            if e.kind == "warning":
                assert 0.75 * budget <= e.tokens_before < 0.9 * budget
            else:
                assert e.tokens_before >= 0.9 * budget
                assert e.tokens_after + 0 <= 0.7 * budget
                assert agent.state.messages[0].role == "user"  # cut at a turn start
        assert agent.tokens() <= budget
        assert before <= budget
    assert "warning" in kinds and "compaction" in kinds
    assert kinds.index("warning") < kinds.index("compaction")
    assert agent.recall.count() == 40  # every message is kept in recall memory


def test_a_turn_that_alone_exceeds_the_budget_is_one_sentence(word_backend, store):
    agent = make_agent(word_backend, store, window=60, reserve=10)
    agent.observe(convo(1, words=5))
    with pytest.raises(CtxlabError) as err:
        agent.observe(Message("user", "word " * 80))
    assert "the newest turn alone needs" in str(err.value)
    assert agent.recall.count() == 3  # the record is still complete


def test_bad_shares_are_refused():
    with pytest.raises(CtxlabError):
        MemoryConfig(window=100, reserve=100)
    with pytest.raises(CtxlabError):
        MemoryConfig(window=100, target_share=0.95, compact_share=0.9)


def test_a_window_larger_than_the_models_is_refused(word_backend, store):
    with pytest.raises(CtxlabError, match="exceeds the model's context window of 256"):
        MemoryAgent(word_backend, "truncation", store, MemoryConfig(window=1000))
