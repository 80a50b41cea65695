"""A probe word the server's tokenizer splits (" hither" is two tokens on Gemma 3's): with
/tokenize, calibration finds it by bisection and never draws it, so the staircase is exact;
without, the prefix section leaves out every point whose prompt the server counted otherwise.
Checked on the scripted stand-in of tests/probe/conftest.py with a paged prefix cache."""

from __future__ import annotations

import pytest

from ctxlab.bench.words import WORDS
from ctxlab.errors import CtxlabError
from ctxlab.probe import calibration, prefix
from ctxlab.probe.prompts import Words
from ctxlab.probe.runner import ProbeConfig, run
from tests.probe.conftest import Script, stand_in

PAGE = 16
LONGEST = 200


def _counter(split: dict[str, int]):
    script = Script(split=split)
    calls: list[int] = []

    def count(s: str) -> int:
        calls.append(1)
        return len(script.tokens(s))

    return count, calls


@pytest.mark.parametrize("split", [{}, {"hither": 2}, {"about": 3, "hither": 2, "youth": 2}])
def test_bisection_finds_exactly_the_split_words_in_few_requests(split):
    count, calls = _counter(split)
    found = calibration.split_words(count)
    assert found is not None
    assert found.left_out == tuple(w for w in WORDS if w in split)
    assert found.requests == len(calls)
    # one request for the list, then two per level of the bisection per split word
    assert len(calls) <= 1 + 2 * len(split) * 10
    assert not found.joined


def test_the_rule_names_the_words_left_out():
    found = calibration.split_words(_counter({"hither": 2})[0])
    assert found is not None and found.how() == "1 of 1,024 words left out: hither"
    assert calibration.split_words(_counter({})[0]).how().startswith("every one of the 1,024")


def test_words_never_draws_a_word_left_out():
    words = Words(3, ("hither", "about"))
    drawn = set(words.take(20_000)) | {words.other_than("x") for _ in range(2_000)}
    assert "hither" not in drawn and "about" not in drawn
    assert Words(3).take(50) == Words(3, ()).take(50)  # nothing left out: the same stream


def test_no_tokenize_answer_is_none_and_too_many_splits_are_one_sentence():
    assert calibration.split_words(lambda _s: None) is None
    many = {w: 2 for w in WORDS[:100]}
    with pytest.raises(CtxlabError, match="not one token"):
        calibration.split_words(_counter(many)[0])


@pytest.mark.parametrize("constant", [2, 3])
def test_a_tokenize_that_does_not_add_up_stops_in_bounded_requests(constant):
    """A /tokenize that answers the same count for everything: the search neither leaves
    every word out nor runs a request per word."""
    calls: list[int] = []

    def count(_s: str) -> int:
        calls.append(1)
        return constant

    with pytest.raises(CtxlabError, match="/tokenize"):
        calibration.split_words(count)
    assert len(calls) <= calibration.MOST_REQUESTS


def _probe(script: Script, nonce: int):
    with stand_in(script) as url:
        cfg = ProbeConfig(url, sections=("prefix",), longest=LONGEST, nonce=nonce)
        return run(cfg)


def _base_words(nonce: int) -> tuple[set[str], list[str]]:
    """The runner's draws with nothing left out: the calibration prompts' words, then the
    staircase's base prompt."""
    words = Words(nonce)
    calib = set(words.take(48)) | set(words.take(112))
    return calib, words.take(LONGEST + prefix.TAIL)


def _split_in_base(nonce: int) -> tuple[str, int]:
    """A word of the base prompt that no calibration prompt holds, first seen near the
    middle, and the index where it first occurs."""
    calib, base = _base_words(nonce)
    for i in range(LONGEST // 2, LONGEST):
        w = base[i]
        if w not in calib and w not in base[:i]:
            return w, i
    raise AssertionError("no usable word")


def test_with_tokenize_the_split_word_is_left_out_and_the_staircase_is_exact():
    nonce = 11
    word, _ = _split_in_base(nonce)
    script = Script(split={word: 2}, tokenize=True, page=PAGE)
    rep = _probe(script, nonce)
    assert not rep.error, rep.error
    assert f"1 of 1,024 words left out: {word}" in rep.token_rule
    assert script.tokenized <= 1 + 2 * 10 + 2 + 1  # search, two calibration prompts, check
    stairs = rep.details["staircase"]
    assert stairs and all(p["placed"] for p in stairs)
    assert all(p["prompt_tokens"] == p["position"] + prefix.TAIL for p in stairs)
    assert all(p["cached"] == p["position"] // PAGE * PAGE for p in stairs)
    g = rep.figure("prefix caching", "cache granularity")
    assert g is not None and (g.value, g.how) == (PAGE, "measured"), g
    assert "left out" not in g.note


def test_without_tokenize_the_misplaced_points_are_left_out():
    nonce = 11
    word, at = _split_in_base(nonce)
    script = Script(split={word: 2}, page=PAGE)
    rep = _probe(script, nonce)
    assert not rep.error, rep.error
    stairs = rep.details["staircase"]
    placed = [p for p in stairs if p["placed"]]
    off = [p for p in stairs if not p["placed"]]
    # every point whose shared prefix holds the word is counted one token long: left out
    assert {p["position"] for p in stairs if p["position"] > at} <= {p["position"] for p in off}
    assert all(p["prompt_tokens"] != p["position"] + prefix.TAIL for p in off)
    assert all(p["cached"] == p["position"] // PAGE * PAGE for p in placed)
    # had they been placed, the staircase would not be floor(position / page) x page
    assert any(p["cached"] != p["position"] // PAGE * PAGE for p in off)
    g = rep.figure("prefix caching", "cache granularity")
    assert g is not None and (g.value, g.how) == (PAGE, "measured"), g
    assert f"{len(off)} of {len(stairs)} divergence points left out" in g.note
    assert "position + 8 tokens" in g.note
