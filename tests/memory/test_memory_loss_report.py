"""The compaction loss report's three classes on a hand-made history, and its accuracy."""

from __future__ import annotations

from memory_fakes import WordBackend

from ctxlab.memory.budget import MemoryConfig
from ctxlab.memory.fixtures import Fact
from ctxlab.memory.loss import compaction_report, model_ceiling
from ctxlab.memory.messages import Message


def history() -> list[Message]:
    msgs = [
        Message("user", "My cat is called Pemberly."),  # 0: evicted, searchable
        Message("assistant", "Lovely name."),
        Message("user", "Zorblat reading: 77."),  # 2: evicted, no word in common with its question
        Message("assistant", "Noted."),
    ]
    for t in range(12):
        msgs.append(Message("user", f"Tell me something about the weather pattern number {t}."))
        msgs.append(Message("assistant", f"The weather pattern {t} is mild with light rain."))
    msgs.append(Message("user", "My locker code is 4417."))  # 28: recent, in context
    msgs.append(Message("assistant", "Got it."))
    return msgs


FACTS = [
    Fact("cat", "What is my cat called?", "Pemberly", 0),
    Fact("gauge", "Which figure did my gauge show?", "77", 2),
    Fact("locker", "What is my locker code?", "4417", 28),
]


def answer_from_context(chat):
    text = " ".join(m["content"] for m in chat[:-1])
    question = chat[-1]["content"]
    if "locker" in question and "4417" in text:
        return "It is 4417."
    if "cat" in question and "Pemberly" in text:
        return "Pemberly."
    return "I do not know."


def test_in_context_recoverable_and_lost():
    backend = WordBackend(window=160, answer=answer_from_context)
    cfg = MemoryConfig(window=160, reserve=16)
    report = compaction_report(history(), FACTS, "truncation", backend, cfg, 2, "bm25", 8)
    status = {f.id: f.status for f in report.facts}
    assert status == {"cat": "recoverable", "gauge": "lost", "locker": "in_context"}
    ranks = {f.id: f.search_rank for f in report.facts}
    assert ranks["cat"] == 1 and ranks["gauge"] is None
    correct = {f.id: f.correct for f in report.facts}
    assert correct == {"cat": False, "gauge": False, "locker": True}
    assert report.accuracy == 1 / 3
    assert report.tokens_before > report.tokens_after
    assert report.compactions >= 1 and report.evicted >= 4
    row = report.summary()
    assert (row["in_context"], row["recoverable"], row["lost"]) == (1, 1, 1)
    assert report.note == ""  # truncation writes none


def test_tiered_memory_turns_recoverable_into_answers():
    backend = WordBackend(window=160, answer=answer_from_context)
    cfg = MemoryConfig(window=160, reserve=16, retrieve_k=2)
    report = compaction_report(history(), FACTS, "tiered", backend, cfg, 2, "bm25", 8)
    correct = {f.id: f.correct for f in report.facts}
    assert correct["cat"]  # recalled into context by the question itself
    assert report.note.startswith("Recall memory holds")
    assert not correct["gauge"]


def test_model_ceiling_sees_only_the_stating_message():
    backend = WordBackend(window=160, answer=answer_from_context)
    assert model_ceiling(history(), FACTS, backend) == 2 / 3
    for chat in backend.calls:
        assert len(chat) == 3  # system, the stating message, the question


def test_compaction_that_discards_the_log_loses_what_its_summary_left_out():
    backend = WordBackend(window=160, answer=answer_from_context)
    cfg = MemoryConfig(window=160, reserve=16)
    kept = compaction_report(history(), FACTS, "truncation", backend, cfg, 2, "bm25", 8)
    gone = compaction_report(history(), FACTS, "compact", backend, cfg, 2, "bm25", 8)
    status = {f.id: f.status for f in gone.facts}
    # the fake model's summary says nothing, and the log no longer holds the cat's message
    assert status == {"cat": "lost", "gauge": "lost", "locker": "in_context"}
    assert {f.id: f.status for f in kept.facts}["cat"] == "recoverable"
    assert gone.note.startswith("Summary of the")
    row = gone.summary()
    assert row["kept"] == 1 and row["keeps_log"] is False and kept.summary()["keeps_log"]
    assert row["kept_low"] < 1 / 3 < row["kept_high"]  # Wilson interval of 1 of 3 facts kept
    assert gone.lost_facts() == ["cat", "gauge"]


def test_forget_deletes_messages_and_their_index(tmp_path):
    from ctxlab.memory.recall import RecallMemory
    from ctxlab.memory.store import open_store

    with open_store(tmp_path / "m.db") as store:
        recall = RecallMemory(store, None, "a")
        stored = recall.add([Message("user", "My cat is called Pemberly."), Message("user", "Hi")])
        assert recall.forget([stored[0].id]) == 1
        assert recall.count() == 1 and recall.search("Pemberly", 3, "bm25") == []
