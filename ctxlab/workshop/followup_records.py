"""Demonstration 10's records: what `demo_followup.py` measures and `followup_report.py`
renders (kept apart so that neither module imports the other).

The records keep the rule of a demonstration's `measure`: frozen, tuples, numbers, bools
and `Literal`s; the only strings are what the run produced or the fixture wrote (a
document's text, a fact's key and value). A row's label ("snapkv@0.25") is not stored: it
is rendered from its class, its policy's index in the configured list and its budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RowKind = Literal[
    "full", "fresh prefill", "query-aware", "key-based", "positional", "recall base", "recall"
]


@dataclass(frozen=True)
class Fact:
    """One planted fact, as the seeded document holds it."""

    key: str  # the fixture's name for it
    value: str  # the 4-digit number its question asks for
    depth: float  # where it sits in the document (0 first, 1 last)


@dataclass(frozen=True)
class Doc:
    """One seeded document and its facts, in the order they are asked."""

    text: str
    facts: tuple[Fact, ...]  # facts[0] is question 1


@dataclass(frozen=True)
class Row:
    """One setting, every conversation: answers right per question, bytes, times."""

    kind: RowKind
    policy: int | None  # index in followup.policies (None: full, fresh prefill, recall rows)
    share: float | None  # budget as a share of question 1's prompt
    tokens: int | None  # budget in tokens (recall and its base)
    q1: tuple[bool, ...]  # per document
    follow: tuple[bool, ...]  # per (document, follow-up), in order
    resident_q1: tuple[int, ...]  # bytes after question 1, per doc
    resident_end: tuple[int, ...]  # after the last follow-up
    ttft_ms: tuple[float, ...]  # per follow-up
    tpot_ms: tuple[float, ...]
    computed: tuple[int, ...]  # prompt tokens computed per follow-up
    preemptions: int
    far_bytes: int | None  # recall: bytes sent to the far tier
    far_back_bytes: int | None  # recall: bytes brought back


@dataclass(frozen=True)
class Measured:
    rows: tuple[Row, ...]
    docs: tuple[Doc, ...]
    prompt_tokens: tuple[int, ...]  # question 1's prompt per document
    fresh_ttft_ms: tuple[float, ...]  # a cold prefill of a document and its question, alone
    slot_bytes: int
    budgets: tuple[float, ...]
    main: float  # the budget the class metrics read: the first
    wall_s: float
