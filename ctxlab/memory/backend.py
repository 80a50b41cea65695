"""What memory and retrieval need from a model: exact token counts and replies.

Two implementations: `EngineBackend` (ctxlab's own engine, the default model) and
`OpenAIChatBackend` (any OpenAI-compatible server). Counting is always done the way the
model will see the text, chat template and generation prompt included, because budgets
estimated from characters or from another tokenizer misfire near the window's edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

Chat = Sequence[dict[str, str]]


@dataclass(frozen=True)
class Reply:
    text: str
    prompt_tokens: int
    output_tokens: int


@runtime_checkable
class Backend(Protocol):
    """A model behind memory and retrieval."""

    name: str

    @property
    def context_window(self) -> int:
        """Tokens the model accepts (prompt plus output)."""
        ...

    def count_tokens(self, chat: Chat) -> int:
        """Prompt tokens of this chat exactly as sent: template and generation prompt included."""
        ...

    def generate(self, chats: Sequence[Chat], max_tokens: int) -> list[Reply]:
        """Greedy replies, one per chat, in order."""
        ...

    def measure_prefill(self, chat: Chat) -> float | None:
        """Seconds to prefill this chat alone (first token), or None when not measurable."""
        ...


@runtime_checkable
class Loads(Protocol):
    """A backend whose model loads lazily, and can be loaded ahead of its first call, so a
    caller can time the load apart from the model call (`rag ask`'s breakdown)."""

    def load(self) -> None:
        """Load the model now (tokenizer and weights); a second call does nothing."""
        ...


@runtime_checkable
class TextTokenizer(Protocol):
    """Token boundaries of plain text, for chunking documents in tokens."""

    name: str

    def spans(self, text: str) -> list[tuple[int, int]]:
        """(start, end) character offsets of each token of `text`, in order."""
        ...


def text_tokens(backend: Backend, text: str) -> int:
    """Tokens `text` adds inside a message (the template's fixed part subtracted)."""
    empty = backend.count_tokens([{"role": "user", "content": ""}])
    return backend.count_tokens([{"role": "user", "content": text}]) - empty
