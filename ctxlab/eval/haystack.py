"""Filler text of a given size with sentences inserted at chosen depths.

Three haystacks, as RULER defines them: `noise` (one fixed paragraph repeated), `essay`
(natural text, here the shipped Shakespeare) and `needle` (the filler is itself made of
distractor needles with other keys, the hardest kind). A haystack is a list of units; needles
go between units, so a depth of 0.0 puts a needle first and 1.0 puts it last.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from ctxlab.eval import vocab

HaystackKind = Literal["noise", "essay", "needle"]
HAYSTACK_KINDS: tuple[str, ...] = ("noise", "essay", "needle")
NOISE_SENTENCES = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)


def needle_sentence(kind: vocab.ValueKind, key: str, value: str) -> str:
    return f"One of the special magic {kind} for {key} is: {value}."


def filler_units(
    kind: HaystackKind,
    n_units: int,
    rng: random.Random,
    value_kind: vocab.ValueKind = "numbers",
    exclude_keys: frozenset[str] = frozenset(),
) -> list[str]:
    """`n_units` filler sentences; `rng` picks the essay offset and the distractor needles.

    Distractor needles never use a key in `exclude_keys`, so the asked key stays unambiguous.
    """
    if kind == "noise":
        return [NOISE_SENTENCES[i % len(NOISE_SENTENCES)] for i in range(n_units)]
    if kind == "essay":
        sentences = vocab.essay_sentences()
        start = rng.randrange(len(sentences))
        return [sentences[(start + i) % len(sentences)] for i in range(n_units)]
    if kind == "needle":
        units = []
        while len(units) < n_units:
            key = vocab.word_key(rng)
            if key not in exclude_keys:
                units.append(needle_sentence(value_kind, key, vocab.value(rng, value_kind)))
        return units
    raise ValueError(f"unknown haystack {kind!r}")


def insert_at_depths(
    units: Sequence[str], inserts: Sequence[tuple[float, str]]
) -> tuple[list[str], list[int]]:
    """Place each (depth, sentence) between units; returns the new list and where each went.

    Inserts at equal depth keep their given order. Indices refer to the returned list.
    """
    slots = sorted(
        ((round(depth * len(units)), order, text) for order, (depth, text) in enumerate(inserts)),
    )
    out: list[str] = []
    where = [0] * len(inserts)
    cursor = 0
    for slot, order, text in slots:
        out.extend(units[cursor:slot])
        cursor = max(cursor, slot)
        where[order] = len(out)
        out.append(text)
    out.extend(units[cursor:])
    return out, where


def join_units(units: Sequence[str], kind: HaystackKind) -> str:
    return ("\n" if kind == "needle" else " ").join(units)
