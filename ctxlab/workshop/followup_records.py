"""Demonstration 10's records: what `demo_followup.py` measures and `followup_report.py`
renders (kept apart so that neither module imports the other)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Doc:
    """One seeded document and its questions, in the order they are asked."""

    text: str
    keys: list[str]  # asked order: keys[0] is question 1
    values: list[str]
    depths: list[float]  # where each asked fact sits in the document (0 first, 1 last)


@dataclass
class Row:
    """One setting, every conversation: answers right per question, bytes, times."""

    setting: str
    kind: str  # "full", a policy class, "recall", "recall base", "fresh prefill"
    share: float | None = None  # budget as a share of question 1's prompt
    tokens: int | None = None  # budget in tokens (recall and its base)
    q1: list[bool] = field(default_factory=list)  # per document
    follow: list[bool] = field(default_factory=list)  # per (document, follow-up), in order
    resident_q1: list[int] = field(default_factory=list)  # bytes after question 1, per doc
    resident_end: list[int] = field(default_factory=list)  # after the last follow-up
    ttft_ms: list[float] = field(default_factory=list)  # per follow-up
    tpot_ms: list[float] = field(default_factory=list)
    computed: list[int] = field(default_factory=list)  # prompt tokens computed per follow-up
    preemptions: int = 0
    far_bytes: int | None = None  # recall: bytes sent to the far tier
    far_back_bytes: int | None = None  # recall: bytes brought back


@dataclass
class Measured:
    rows: list[Row]
    docs: list[Doc]
    prompt_tokens: list[int]  # question 1's prompt per document
    fresh_ttft_ms: list[float]  # a cold prefill of a document and its question, one at a time
    slot_bytes: int
    budgets: list[float]
    main: float  # the budget the class metrics read: the first
    wall_s: float = 0.0
