"""Chunks measured in the model's tokens, ending at sentence ends where one is near.

A chunk holds at most `size` tokens; consecutive chunks share `overlap` tokens. The end of
a chunk moves back to the last sentence or paragraph end in its second half, so a fact
stated in one sentence lands whole in one chunk; the overlap then carries the previous
sentence's tail as context. Offsets are characters of the document, so a chunk's text is
exactly a slice of it.
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


def chunk_text(text: str, spans: Sequence[tuple[int, int]], size: int, overlap: int) -> list[Chunk]:
    """Split `text` (whose tokens are `spans`) into chunks of at most `size` tokens."""
    check_sizes(size, overlap)
    n = len(spans)
    if n == 0:
        return []
    ends = [False] + [
        _ends_sentence(text, spans[j - 1][1], text[slice(*spans[j - 1])]) for j in range(1, n + 1)
    ]
    chunks: list[Chunk] = []
    i = 0
    while i < n:
        j = min(i + size, n)
        if j < n:
            for b in range(j, i + size // 2, -1):
                if ends[b]:
                    j = b
                    break
        start, end = spans[i][0], spans[j - 1][1]
        while start < end and text[start].isspace():
            start += 1
        chunks.append(Chunk(len(chunks), start, end, j - i, text[start:end]))
        if j >= n:
            break
        i = max(j - overlap, i + 1)
    return chunks
