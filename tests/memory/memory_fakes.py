"""A deterministic stand-in for a model, so memory and retrieval logic run without one.

`WordBackend` counts a chat as its whitespace words plus a fixed cost per message and for
the generation prompt (the shape of a real chat template's count), splits text into
whitespace tokens for chunking, and answers each chat with a scripted function.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import pytest

from ctxlab.memory.backend import Reply

PER_MESSAGE = 4
GENERATION_PROMPT = 3


class WordBackend:
    name = "words"

    def __init__(self, window: int = 256, answer: Callable[[list[dict]], str] | None = None):
        self._window = window
        self.answer = answer or (lambda chat: "ok")
        self.calls: list[list[dict]] = []

    @property
    def context_window(self) -> int:
        return self._window

    def count_tokens(self, chat: Sequence[dict]) -> int:
        return GENERATION_PROMPT + sum(PER_MESSAGE + len(m["content"].split()) for m in chat)

    def spans(self, text: str) -> list[tuple[int, int]]:
        return [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]

    def generate(self, chats: Sequence[Sequence[dict]], max_tokens: int) -> list[Reply]:
        out = []
        for chat in chats:
            self.calls.append(list(chat))
            text = " ".join(self.answer(list(chat)).split()[:max_tokens])
            out.append(Reply(text, self.count_tokens(chat), len(text.split())))
        return out

    def measure_prefill(self, chat: Sequence[dict]) -> float | None:
        return None


@pytest.fixture(scope="session")
def real_backend(loaded):
    """The default model behind the Backend protocol, sharing the session's loaded weights
    (counting needs only its tokenizer; generating builds an engine over the same weights)."""
    from ctxlab.memory.engine_backend import EngineBackend

    return EngineBackend(loaded, context_window=8192)
