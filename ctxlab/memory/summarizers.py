"""Who writes a summary: the model (`ModelSummarizer`) or a sentence picker
(`ExtractiveSummarizer`) for models too small to summarise faithfully.

Both fold the previous summary and the newly evicted messages into at most `max_tokens`
tokens (counted with the backend's tokenizer), which makes the summary recursive: what was
summarised before is summarised again with what is new.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from ctxlab.memory.backend import Backend, text_tokens
from ctxlab.memory.messages import Message

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")

SUMMARY_SYSTEM = (
    "You summarise conversations. Keep every name, number, date, code and place exactly as "
    "written. Write plain sentences, no lists."
)


class Summarizer(Protocol):
    label: str

    def summarize(
        self, previous: str, messages: Sequence[Message], max_tokens: int, backend: Backend
    ) -> str: ...


def transcript(messages: Sequence[Message]) -> str:
    return "\n".join(f"{m.role}: {m.content}" for m in messages)


class ModelSummarizer:
    """The model summarises; input longer than its window is folded in pieces."""

    label = "written by the model"

    def summarize(
        self, previous: str, messages: Sequence[Message], max_tokens: int, backend: Backend
    ) -> str:
        limit = backend.context_window - max_tokens
        summary = previous
        pending = list(messages)
        while pending:
            take = len(pending)
            while take > 1 and backend.count_tokens(self._chat(summary, pending[:take])) > limit:
                take = max(1, take // 2)
            reply = backend.generate([self._chat(summary, pending[:take])], max_tokens)[0]
            summary = reply.text.strip() or summary
            pending = pending[take:]
        return summary

    @staticmethod
    def _chat(previous: str, messages: Sequence[Message]) -> list[dict[str, str]]:
        before = f"Summary so far:\n{previous}\n\n" if previous else ""
        return [
            {"role": "system", "content": SUMMARY_SYSTEM},
            {
                "role": "user",
                "content": f"{before}New messages:\n{transcript(messages)}\n\n"
                "Write one updated summary of everything above in a few sentences.",
            },
        ]


class ExtractiveSummarizer:
    """Keeps whole sentences, the most informative first, within the token budget.

    A sentence scores by its rare words (inverse frequency over the sentences at hand),
    numbers and capitalised names, with a bonus for what the user said (users state the
    facts an assistant must keep). Chosen sentences keep their original order.
    """

    label = "extractive: sentences kept verbatim, not written by the model"

    def summarize(
        self, previous: str, messages: Sequence[Message], max_tokens: int, backend: Backend
    ) -> str:
        pool: list[tuple[str, bool]] = [(s, True) for s in _sentences(previous)]
        for m in messages:
            prefix = "User: " if m.role == "user" else "Assistant: "
            pool += [
                (s if s.startswith(("User: ", "Assistant: ")) else prefix + s, m.role == "user")
                for s in _sentences(m.content)
            ]
        if not pool:
            return previous
        scores = _scores([s for s, _ in pool], [u for _, u in pool])
        order = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
        chosen: list[int] = []
        for i in order:
            trial = " ".join(pool[j][0] for j in sorted([*chosen, i]))
            if text_tokens(backend, trial) <= max_tokens:
                chosen.append(i)
        return " ".join(pool[j][0] for j in sorted(chosen))


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s and s.strip()]


def _scores(sentences: Sequence[str], from_user: Sequence[bool]) -> list[float]:
    words = [[w.lower() for w in _WORD.findall(s)] for s in sentences]
    df = Counter(w for ws in words for w in set(ws))
    n = len(sentences)
    out = []
    for s, ws, user in zip(sentences, words, from_user, strict=True):
        if not ws:
            out.append(0.0)
            continue
        rarity = sum(math.log((n + 1) / df[w]) for w in set(ws)) / math.sqrt(len(ws))
        digits = sum(any(c.isdigit() for c in w) for w in ws)
        names = sum(1 for w in _WORD.findall(s)[1:] if w[0].isupper())
        out.append(rarity + 2.0 * digits + 1.0 * names + (1.5 if user else 0.0))
    return out
