"""Retrieval and citation metrics over evidence, each evidence item a set of chunk keys.

A question's evidence is one or more sentences; each is satisfied by any chunk that holds
it (overlapping chunks can both hold one). recall@k is the share of evidence items
satisfied by the top k; the reciprocal rank is 1 / the rank of the first chunk that
satisfies any item (0 if none does). Citation precision is the share of cited chunks that
satisfy some item (over answers that cite anything); citation recall is the share of
evidence items a cited chunk satisfies.
"""

from __future__ import annotations

from collections.abc import Sequence


def recall_at_k(ranked: Sequence[str], evidence: Sequence[set[str]], k: int) -> float:
    if not evidence:
        raise ValueError("a question needs at least one evidence item")
    top = set(ranked[:k])
    return sum(bool(top & item) for item in evidence) / len(evidence)


def reciprocal_rank(ranked: Sequence[str], evidence: Sequence[set[str]]) -> float:
    gold = set().union(*evidence) if evidence else set()
    return next((1.0 / (i + 1) for i, key in enumerate(ranked) if key in gold), 0.0)


def citation_precision(cited: Sequence[str], evidence: Sequence[set[str]]) -> float | None:
    """None when nothing is cited (the answer is then not counted for precision)."""
    if not cited:
        return None
    gold = set().union(*evidence) if evidence else set()
    return sum(key in gold for key in cited) / len(cited)


def citation_recall(cited: Sequence[str], evidence: Sequence[set[str]]) -> float:
    return recall_at_k(list(cited), evidence, len(cited)) if cited else 0.0


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
