"""Seeded sources of keys, values and filler words for the task generators.

Word keys are adjective-noun pairs (as RULER's word needles are), values are 7-digit numbers,
UUIDs or words. The essay vocabulary is drawn from the public-domain Shakespeare text that ships
with the package, so no word list has to be downloaded.
"""

from __future__ import annotations

import random
import re
import uuid
from functools import lru_cache
from importlib import resources
from typing import Literal

ValueKind = Literal["numbers", "uuids", "words"]
VALUE_KINDS: tuple[str, ...] = ("numbers", "uuids", "words")

ADJECTIVES = (
    "amber brave calm dusty eager faint gentle hollow icy jolly keen lively mellow noble "
    "odd proud quiet rapid silent tidy upbeat vivid wary young zesty bold crisp damp "
    "early fierce grand humble ivory jagged kind lofty misty narrow orange plain rusty "
    "shiny tender vast wild woven sandy sleepy sturdy swift violet"
).split()
NOUNS = (
    "otter falcon maple river lantern harbor meadow pebble quartz raven saddle thistle "
    "tulip walnut willow badger beacon cactus canyon comet cedar dolphin ember fern "
    "glacier heron island jackal kettle lagoon magnet nectar orchid parrot quill reef "
    "salmon spruce tiger tundra valley violin wagon yarrow zebra anchor basil cobalt"
).split()
FIRST_NAMES = (
    "Ada Bruno Clara Dmitri Elena Farid Greta Hugo Ines Jonas Kira Luca Mira Nils Olga "
    "Pavel Rosa Soren Tara Ugo Vera Willem Yara Zane Alma Bastian Cyra Dario Edda Felix"
).split()
LAST_NAMES = (
    "Albrecht Bianchi Castell Dorsey Eklund Faraday Gallo Hartmann Ivanova Jansen Kowalski "
    "Lindqvist Moreau Novak Okafor Petrov Quintero Rossi Sandoval Tanaka Ulrich Varga "
    "Whitlock Xu Yilmaz Zelenko"
).split()
SYLLABLES = "ba ro ten vil mar quo sel dun ka lis tor and mir ess gal pen hov rue sta".split()


def word_key(rng: random.Random) -> str:
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def distinct_keys(rng: random.Random, n: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < n:
        key = word_key(rng)
        if key not in keys:
            keys.append(key)
    return keys


def value(rng: random.Random, kind: ValueKind) -> str:
    if kind == "numbers":
        return str(rng.randint(1_000_000, 9_999_999))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return word_key(rng)


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def place(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize()


def variable_name(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))


@lru_cache(maxsize=1)
def essay_text() -> str:
    """The shipped public-domain natural text (Shakespeare's plays)."""
    return resources.files("ctxlab").joinpath("data", "tinyshakespeare.txt").read_text("utf-8")


@lru_cache(maxsize=1)
def essay_sentences() -> tuple[str, ...]:
    """The natural text split into sentence-like units (no speaker labels)."""
    lines = [ln.strip() for ln in essay_text().splitlines()]
    prose = " ".join(ln for ln in lines if ln and not ln.endswith(":"))
    parts = re.split(r"(?<=[.!?])\s+", prose)
    return tuple(p for p in parts if len(p.split()) >= 3)


@lru_cache(maxsize=1)
def plain_words() -> tuple[str, ...]:
    """Distinct lower-case words of four or more letters from the natural text, sorted."""
    return tuple(sorted(set(re.findall(r"\b[a-z]{4,}\b", essay_text().lower()))))
