"""Prompts whose token count is known without the model's tokenizer.

Prompts are made of the load generator's words (`ctxlab.bench.words`: one token each, with
its leading space, on SmolLM2 and most BPE tokenizers of its kind), so "diverge at token d"
is "diverge at word d". That rule is checked against the server, not assumed: calibration
sends two prompts and reads `usage.prompt_tokens` (the server's own count); words must cost
exactly one token each, and the constant the server adds (a BOS or other special token) is
measured as the offset. Where the server has `/tokenize` the same words are also counted
there, and the few words its tokenizer splits are found and never drawn
(`ctxlab.probe.calibration`). If the rule fails the probe stops with one sentence instead of
mislabelling positions.

Every run draws from a fresh random stream (its nonce is in the report): a second probe of
the same server must not find the first one's prompts in the cache.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ctxlab.bench.words import WORDS
from ctxlab.errors import CtxlabError


class Words:
    """Fresh random words; no two prompts from one source share a first word pair.
    `left_out`: words the server's tokenizer does not count as one token, never drawn."""

    def __init__(self, nonce: int, left_out: tuple[str, ...] = ()) -> None:
        self.rng = random.Random(nonce)
        out = set(left_out)
        self.pool = [w for w in WORDS if w not in out] if out else list(WORDS)

    def take(self, n: int) -> list[str]:
        return [self.pool[self.rng.randrange(len(self.pool))] for _ in range(n)]

    def other_than(self, word: str) -> str:
        while True:
            w = self.pool[self.rng.randrange(len(self.pool))]
            if w != word:
                return w


UNKNOWN_PAGE = 128  # page assumed when the prefix section did not measure one (vLLM's CPU
# default, the largest common default: SGLang 1, llama.cpp 1, vLLM on GPU 16, ctxlab 16)


def reusable_tokens(page: int | None, floor: int = 96) -> int:
    """Length of a prompt that must be reusable on a paged cache: at least two whole pages
    plus a tail (a cache reuses only whole pages and never a prompt's last token), and at
    least `floor` tokens on a fine-grained cache."""
    unit = UNKNOWN_PAGE if page is None else max(1, page)
    return max(floor, 2 * unit + max(8, unit // 4))


def text(words: list[str]) -> str:
    return "".join(" " + w for w in words)


@dataclass(frozen=True)
class TokenRule:
    """Prompt tokens = words + offset, as the server counted them."""

    offset: int  # tokens the server adds to every prompt (BOS, ...)
    how: str  # how the rule was checked
    left_out: tuple[str, ...] = ()  # words the server's tokenizer splits, never drawn

    def with_left_out(self, left_out: tuple[str, ...], said: str) -> TokenRule:
        """The rule with the words /tokenize found split (`said`: how they are named)."""
        return TokenRule(self.offset, f"{self.how} ({said})", left_out)

    def words_for(self, tokens: int) -> int:
        """Words that make a prompt of exactly `tokens` tokens."""
        return max(1, tokens - self.offset)


def check_rule(counts: dict[int, int], tokenized: dict[int, int] | None) -> TokenRule:
    """From {words: usage.prompt_tokens} at two lengths (and /tokenize counts, if any)."""
    (n1, t1), (n2, t2) = sorted(counts.items())
    if t2 - t1 != n2 - n1:
        raise CtxlabError(
            f"the server counts {t1} and {t2} tokens for prompts of {n1} and {n2} of the "
            "probe's words, not one token per word, so divergence positions cannot be placed "
            "on its tokenizer; the probe supports tokenizers where common English words with "
            "a leading space are one token (Llama, Qwen, SmolLM, Mistral families)"
        )
    how = f"usage.prompt_tokens at {n1} and {n2} words"
    if tokenized:
        if any(tokenized[n] != n for n in tokenized):
            raise CtxlabError(
                "the server's /tokenize splits the probe's words into more than one token each"
            )
        how += " and the server's /tokenize"
    return TokenRule(offset=t1 - n1, how=how)
