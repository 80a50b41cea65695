"""The seeded conversation fixture, and every bad history or facts file as one sentence."""

from __future__ import annotations

import json

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.memory.fixtures import conversation_fixture, load_fixture_files, read_facts
from ctxlab.memory.messages import read_history


def test_same_seed_same_conversation_and_facts_point_at_their_messages():
    a, b = conversation_fixture(3), conversation_fixture(3)
    assert a.history == b.history and a.facts == b.facts
    assert conversation_fixture(4).history != a.history
    for fact in a.facts:
        assert fact.answer in a.history[fact.message].content
        assert a.history[fact.message].role == "user"
        for old in fact.superseded:  # an updated fact: the old message has the old value
            assert fact.answer not in a.history[old].content
            assert old < fact.message
    assert sum(bool(f.superseded) for f in a.facts) == 1
    sessions = {m.session for m in a.history}
    assert len(sessions) == 6
    assert [m.created_at for m in a.history] == sorted(m.created_at for m in a.history)


def test_fixture_files_round_trip(tmp_path):
    fx = conversation_fixture(0)
    history, facts = fx.write(tmp_path)
    messages, fact_list = load_fixture_files(history, facts)
    assert [(m.role, m.content, m.session, m.created_at) for m in messages] == [
        (m.role, m.content, m.session, m.created_at) for m in fx.history
    ]
    assert fact_list == fx.facts


@pytest.mark.parametrize(
    ("content", "phrase"),
    [
        ("", "is empty"),
        ("{not json", "h.jsonl line 1 is not valid JSON"),
        ('{"role": "user"}', "needs a role and a content"),
        ('{"role": "wizard", "content": "x"}', "has role 'wizard'"),
        ('{"role": "user", "content": 5}', "not text"),
    ],
)
def test_bad_history_files(tmp_path, content, phrase):
    path = tmp_path / "h.jsonl"
    path.write_text(content)
    with pytest.raises(CtxlabError, match=phrase):
        read_history(path)


@pytest.mark.parametrize(
    ("content", "phrase"),
    [
        ("{", r"f\.json is not valid JSON"),
        ("[]", "non-empty JSON list"),
        ('[{"question": "q"}]', "needs question, answer and message"),
        ('[{"question": "q", "answer": "a", "message": 9}]', "points at message 9"),
    ],
)
def test_bad_facts_files(tmp_path, content, phrase):
    path = tmp_path / "f.json"
    path.write_text(content)
    history = [json.loads('{"role": "user", "content": "x"}')]
    from ctxlab.memory.messages import Message

    with pytest.raises(CtxlabError, match=phrase):
        read_facts(path, [Message(**history[0])])


def test_missing_files(tmp_path):
    with pytest.raises(CtxlabError, match="does not exist"):
        read_history(tmp_path / "nope.jsonl")
