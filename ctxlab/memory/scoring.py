"""Answer grading by normalized string match, shared by compaction reports and retrieval.

Normalization (lower case, Unicode NFKC, punctuation to spaces, articles dropped, spaces
collapsed) follows the usual open-domain QA practice; a prediction is correct when a
normalized gold answer occurs in it as whole words, so "12" does not match "4412".
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    text = _PUNCT.sub(" ", text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_match(prediction: str, answers: Iterable[str]) -> bool:
    """True when any gold answer appears in the prediction (normalized, whole words)."""
    pred = f" {normalize(prediction)} "
    return any((g := normalize(a)) and f" {g} " in pred for a in answers)
