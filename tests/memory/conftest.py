"""Deterministic stand-ins for a model, so memory logic is tested without one.

`WordBackend` counts a chat as its whitespace words plus a fixed cost per message and for
the generation prompt, the shape of a real chat template's count; it answers each chat with
a scripted function. Tests that need the real tokenizer use `real_backend`.
"""

from __future__ import annotations

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
        import re

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


@pytest.fixture
def word_backend() -> WordBackend:
    return WordBackend()


@pytest.fixture
def store(tmp_path):
    from ctxlab.memory.store import open_store

    with open_store(tmp_path / "memory.db") as s:
        yield s


@pytest.fixture(scope="session")
def real_backend(gguf_path):
    """The default model's tokenizer and chat template; weights load only if generating."""
    from ctxlab.memory.engine_backend import EngineBackend

    return EngineBackend(str(gguf_path), context_window=8192)
