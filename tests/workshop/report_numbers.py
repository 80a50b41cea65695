"""Every number a report prints, and whether results.json holds it (shared by the tests).

A printed number matches a stored one when they agree to the printed precision: "1,234.5"
matches 1234.46, not 1234.6. Numbers inside words (p99, llama-3.1-8b, float32) and inside
code spans (file names) are not figures and are skipped; so are dotted versions (vllm 0.32.0).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

NUMBER = re.compile(
    r"(?:(?<=[\s(\[|])-|(?<![\w.,\-]))(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w\-]|\.\d)"
)
CODE = re.compile(r"`[^`]*`")


def printed_numbers(text: str) -> list[str]:
    return NUMBER.findall(CODE.sub(" ", text))


def stored_numbers(doc: Any) -> Iterator[float]:
    if isinstance(doc, bool) or doc is None or isinstance(doc, str):
        return
    if isinstance(doc, int | float):
        yield float(doc)
    elif isinstance(doc, dict):
        for value in doc.values():
            yield from stored_numbers(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from stored_numbers(value)


def unmatched(text: str, doc: Any) -> list[str]:
    """Printed numbers that no stored number equals to the printed precision."""
    stored = sorted(set(stored_numbers(doc)))
    missing = []
    for token in printed_numbers(text):
        value = float(token.replace(",", ""))
        digits = len(token.split(".")[1]) if "." in token else 0
        half = 0.5 * 10**-digits + 1e-9
        if not any(abs(v - value) <= half for v in stored):
            missing.append(token)
    return missing
