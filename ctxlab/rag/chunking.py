"""Chunks measured in the model's tokens, made of whole sentences, with overlap.

A chunk holds at most `size` tokens and is packed with whole sentences, so a fact stated in
one sentence lands whole in one chunk. Consecutive chunks share up to `overlap` tokens: the
previous chunk's last sentences when they fit in the overlap, otherwise its last words. A
sentence longer than a chunk is split into windows that overlap by `overlap` tokens. No
chunk is empty, and none is tiny (under a quarter of `size`) unless the document is: a tiny
piece is merged into a neighbour or grown into more overlap with one. No chunk starts or
ends inside a word or a number ("4,096" is never cut to "096"): a chunk boundary sits only
where the text has whitespace (unless one word is longer than a chunk). Offsets are
characters of the document, so a chunk's text is exactly a slice of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxlab.errors import CtxlabError


@dataclass(frozen=True)
class Chunk:
    index: int
    start: int  # character offsets in the document
    end: int
    tokens: int
    text: str


def check_sizes(size: int, overlap: int) -> None:
    if size < 8:
        raise CtxlabError(f"--chunk-tokens must be at least 8, got {size}.")
    if not 0 <= overlap < size // 2:
        raise CtxlabError(
            f"--overlap-tokens must be at least 0 and below half the chunk ({size // 2}), "
            f"got {overlap}."
        )


def _ends_sentence(text: str, end: int, token: str) -> bool:
    if "\n" in token:
        return True
    stripped = text[:end].rstrip()
    return bool(stripped) and stripped[-1] in ".!?" and (end >= len(text) or text[end].isspace())


def _word_starts(text: str, spans: Sequence[tuple[int, int]]) -> list[bool]:
    """True for tokens a chunk may start at: the first, or one after whitespace."""
    out = []
    for i, (a, _) in enumerate(spans):
        out.append(i == 0 or a == 0 or text[a - 1].isspace() or text[a : a + 1].isspace())
    return out


def chunk_text(text: str, spans: Sequence[tuple[int, int]], size: int, overlap: int) -> list[Chunk]:
    """Split `text` (whose tokens are `spans`) into chunks of at most `size` tokens."""
    check_sizes(size, overlap)
    n = len(spans)
    if n == 0:
        return []
    # ends[b]: a sentence (or paragraph) ends after token b - 1; b = n always ends one.
    ends = [False] + [
        _ends_sentence(text, spans[j - 1][1], text[slice(*spans[j - 1])]) for j in range(1, n + 1)
    ]
    ends[n] = True
    word = [*_word_starts(text, spans), True]
    next_end = [n] * (n + 1)
    for b in range(n - 1, -1, -1):
        next_end[b] = b + 1 if ends[b + 1] else next_end[b + 1]
    ranges: list[tuple[int, int]] = []  # token ranges [i, j)
    i = prev_end = 0
    while i < n:
        j = i
        while j < n and next_end[j] - i <= size:  # whole sentences while they fit
            j = next_end[j]
        if j <= prev_end:
            # No whole sentence fits past the previous chunk's end (one sentence longer than a
            # chunk, or the overlap's tail before one): a window ending between words. Without
            # this the overlap's tail became a chunk of its own, shorter each time.
            top = min(i + size, n)
            past = next((b for b in range(top, prev_end, -1) if word[b]), None)
            # (no word ends past it within reach, e.g. a tokenizer of single characters: end
            # at a word anyway, inside the previous chunk; the next start still moves on)
            j = past if past is not None else next((b for b in range(top, i, -1) if word[b]), top)
        ranges.append((i, j))
        prev_end = j
        if j >= n:
            break
        i = _next_start(i, j, overlap, ends, word)
    chunks: list[Chunk] = []
    for i, j in _absorb_tiny(ranges, size, ends, word):
        start, end = spans[i][0], spans[j - 1][1]
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if start == end:  # only whitespace (blank lines): nothing to retrieve
            continue
        chunks.append(Chunk(len(chunks), start, end, j - i, text[start:end]))
    return chunks


def tiny_tokens(size: int) -> int:
    """Chunks under a quarter of `size` tokens are merged into a neighbour: a chunk of one
    word ("good.") matches nothing a question asks and crowds better passages out of top-k."""
    return max(2, size // 4)


def _absorb_tiny(
    ranges: list[tuple[int, int]], size: int, ends: list[bool], word: list[bool]
) -> list[tuple[int, int]]:
    """Merge each tiny range into the previous one, else the next one, where the union stays
    within `size` tokens; else grow it backwards (to a sentence or word start) up to `size`
    tokens, so it overlaps the previous chunk more instead of standing alone, or forwards
    (to a word end) when there is nothing before it."""
    small = tiny_tokens(size)
    out: list[tuple[int, int]] = []
    k = 0
    while k < len(ranges):
        i, j = ranges[k]
        if j - i < small:
            if out and j - out[-1][0] <= size:
                out[-1] = (out[-1][0], j)
                k += 1
                continue
            if k + 1 < len(ranges) and ranges[k + 1][1] - i <= size:
                ranges[k + 1] = (i, ranges[k + 1][1])
                k += 1
                continue
            lo = max(j - size, out[-1][0] + 1 if out else 0)
            window = range(lo, i)
            i = next((b for b in window if ends[b]), next((b for b in window if word[b]), i))
            if j - i < small:  # nothing before it to take (the first chunk): grow forwards
                top = min(i + size, len(word) - 1)
                j = next((b for b in range(top, j, -1) if word[b]), j)
            while out and out[-1][0] >= i and out[-1][1] <= j:  # now inside the grown one
                out.pop()
        out.append((i, j))
        k += 1
    return out


def _next_start(i: int, j: int, overlap: int, ends: list[bool], word: list[bool]) -> int:
    """Where the chunk after [i, j) starts: the earliest sentence start within `overlap`
    tokens before j, else the earliest word start there, else j; always after i."""
    lo = max(j - overlap, i + 1)
    window = range(lo, j)
    return next((b for b in window if ends[b]), next((b for b in window if word[b]), j))
