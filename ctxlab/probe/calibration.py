"""Calibration: which probe words the server's tokenizer splits, and the token rule.

The probe places tokens by counting words (`ctxlab.probe.prompts`): each of the 1,024 words
of `ctxlab.bench.words.WORDS` must be exactly one token with its leading space. That holds on
SmolLM2's tokenizer and most of its kind, but not on every one: on Gemma 3's, " hither" is two
tokens, and a base prompt that held it twice placed every later divergence point of the
staircase two tokens short. Two calibration prompts cannot see one such word in 1,024.

Where the server has /tokenize, the whole list is tokenized in one request; if the count is
not one token per word, the list is bisected (both halves counted) until the words that are
not one token are found: about 2 log2(1,024) = 20 requests per such word, not 1,024. `Words`
then never draws them, and the rule's `how` names them. Without /tokenize nothing is left
out, and the prefix section checks each of its prompts against the server's own count
instead (`ctxlab.probe.prefix`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ctxlab.bench.words import WORDS
from ctxlab.errors import CtxlabError
from ctxlab.probe.client import ProbeClient
from ctxlab.probe.identify import ServerInfo, tokenize
from ctxlab.probe.prompts import TokenRule, Words, check_rule, text

CALIBRATION = (48, 112)  # words in the two calibration prompts
MOST_SPLIT = 32  # extra tokens over the whole list (or words found) beyond which it stops
MOST_REQUESTS = 1 + 2 * 10 * MOST_SPLIT  # the bisection of 1,024 words for MOST_SPLIT words


@dataclass(frozen=True)
class SplitWords:
    """What /tokenize said about the probe's words."""

    left_out: tuple[str, ...]  # words that are not exactly one token, in list order
    requests: int  # /tokenize requests the search took
    joined: bool  # some group counted off though each of its words is one token

    def how(self, of: int = len(WORDS)) -> str:
        """The words left out, as the token rule's `how` names them."""
        n = len(self.left_out)
        if not n:
            said = f"every one of the {of:,} words is one token"
        else:
            said = f"{n} of {of:,} words left out: {', '.join(self.left_out)}"
        if self.joined:
            said += "; some words tokenize differently side by side than alone"
        return said


def split_words(
    count: Callable[[str], int | None], words: Sequence[str] = WORDS
) -> SplitWords | None:
    """The words of `words` that `count` (the server's /tokenize, no special tokens) does not
    count as one token each, by bisection; None when /tokenize does not answer."""
    requests = 0
    joined = False
    found_so_far: list[str] = []

    def counted(group: Sequence[str]) -> int:
        nonlocal requests
        if requests >= MOST_REQUESTS:
            raise CtxlabError(
                f"the server's /tokenize counts of the probe's words do not add up ({requests} "
                "requests did not isolate the words it splits), so divergence positions cannot "
                "be placed on its tokenizer"
            )
        requests += 1
        n = count(text(list(group)))
        if n is None:
            raise _NoAnswer
        return n

    def find(group: Sequence[str], n: int) -> list[str]:
        nonlocal joined
        if n == len(group):
            return []
        if len(group) == 1:
            found_so_far.append(group[0])
            if len(found_so_far) > MOST_SPLIT:
                raise CtxlabError(
                    f"the server's /tokenize counts more than {MOST_SPLIT} of the probe's words "
                    "as more than one token, so divergence positions cannot be placed on its "
                    "tokenizer"
                )
            return [group[0]]
        mid = len(group) // 2
        found = find(group[:mid], counted(group[:mid])) + find(group[mid:], counted(group[mid:]))
        joined = joined or not found
        return found

    try:
        total = counted(words)
        if total - len(words) > MOST_SPLIT:
            raise CtxlabError(
                f"the server's /tokenize counts {total:,} tokens for the probe's {len(words):,} "
                "words, so many of them are not one token and divergence positions cannot be "
                "placed on its tokenizer; the probe supports tokenizers where common English "
                "words with a leading space are one token (Llama, Qwen, SmolLM, Mistral, Gemma)"
            )
        found = find(words, total)
    except _NoAnswer:
        return None
    return SplitWords(tuple(found), requests, joined)


class _NoAnswer(Exception):
    """/tokenize stopped answering during the search."""


def calibrate(client: ProbeClient, info: ServerInfo, nonce: int) -> tuple[Words, TokenRule]:
    """Fresh words (none the server's tokenizer splits, where /tokenize says which) and the
    server's token rule for them, from two prompts' `usage.prompt_tokens`."""
    split = None
    if info.has_tokenize:
        split = split_words(lambda s: _length(tokenize(client, info, s)))
    words = Words(nonce, split.left_out if split is not None else ())
    counts: dict[int, int] = {}
    tokenized: dict[int, int] = {}
    for n in CALIBRATION:
        w = words.take(n)
        counts[n] = client.complete(text(w), n).prompt_tokens
        ids = tokenize(client, info, text(w))
        if ids is not None:
            tokenized[n] = len(ids)
    rule = check_rule(counts, tokenized or None)
    if split is not None:
        rule = rule.with_left_out(split.left_out, split.how())
    return words, rule


def _length(ids: list[int] | None) -> int | None:
    return None if ids is None else len(ids)
