"""An answer from retrieved passages, with citations `[doc#chunk]`.

Each passage is shown with its key and date after its text, and the prompt says that the
newest date wins when passages disagree. Citations come from the model's text when it writes valid
keys (`cited_by="model"`); a model too small to cite gets citations attributed afterwards:
the passages sharing the most answer words that are not in the question
(`cited_by="attributed"`). The two are reported apart, so a score never mixes them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ctxlab.memory.backend import Backend
from ctxlab.memory.scoring import normalize
from ctxlab.rag.retriever import Passage

ANSWER_SYSTEM = (
    "Answer the question in a few words, using only the passages. Each passage ends with "
    "its id and date in brackets. If passages disagree, the one with the newest date is "
    "right."
)
_CITATION = re.compile(r"\[([^\[\]\s#,]+)#(\d+)(?:,[^\]]*)?\]")  # [doc#3] or [doc#3, date]
_STOP = set(
    "a an the of in on at to for by with and or is was were be been it its this that "
    "which who what when where how many much did does do from as are i you".split()
)


@dataclass
class Answer:
    question: str
    text: str
    citations: list[str]
    cited_by: str  # "model" | "attributed" | "none"
    passages: list[Passage] = field(default_factory=list)
    prompt_tokens: int = 0


def render_passage(p: Passage) -> str:
    """Text first, then `[doc#chunk, date]`: with the id and date in front, the 135M model
    copied them as its answer (a date for "which year", an id for "how many")."""
    return f"{p.text} [{p.key}, {p.date}]"


def answer_chat(question: str, passages: Sequence[Passage]) -> list[dict[str, str]]:
    body = "\n\n".join(render_passage(p) for p in passages)
    content = f"Passages:\n\n{body}\n\nQuestion: {question}" if passages else question
    return [{"role": "system", "content": ANSWER_SYSTEM}, {"role": "user", "content": content}]


def model_citations(text: str, passages: Sequence[Passage]) -> list[str]:
    """Keys the model wrote that name a passage it was given, in order, once each."""
    given = {p.key for p in passages}
    found = [f"{doc}#{chunk}" for doc, chunk in _CITATION.findall(text)]
    return list(dict.fromkeys(k for k in found if k in given))


def attributed_citations(text: str, question: str, passages: Sequence[Passage]) -> list[str]:
    """Passages holding the most answer words that the question does not already contain."""
    asked = set(normalize(question).split()) | _STOP
    words = {w for w in normalize(_CITATION.sub(" ", text)).split() if w not in asked}
    if not words:
        return []
    overlap = {p.key: len(words & set(normalize(p.text).split())) for p in passages}
    best = max(overlap.values(), default=0)
    if best == 0 or best < len(words) / 2:
        return []
    return [key for key, n in overlap.items() if n == best]


def cite(text: str, question: str, passages: Sequence[Passage]) -> tuple[list[str], str]:
    own = model_citations(text, passages)
    if own:
        return own, "model"
    attributed = attributed_citations(text, question, passages)
    return attributed, "attributed" if attributed else "none"


def answer_questions(
    backend: Backend,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage]],
    max_tokens: int = 16,
) -> list[Answer]:
    """Answer each question from its passages (one batch through the backend)."""
    chats = [answer_chat(q, ps) for q, ps in zip(questions, passages, strict=True)]
    replies = backend.generate(chats, max_tokens) if chats else []
    out = []
    for q, ps, reply in zip(questions, passages, replies, strict=True):
        citations, how = cite(reply.text, q, ps)
        out.append(Answer(q, reply.text, citations, how, list(ps), reply.prompt_tokens))
    return out
