"""An answer from retrieved passages, with citations `[doc#chunk]`.

Each passage is shown with its key after its text. Its date is shown too only where the
question is about versions or time ("latest", "current", "as of", "changed", ...; metadata
"auto"), and then the prompt says that the newest date wins when passages disagree: shown
after every passage, the 135M model answered with the date instead of the fact ("which
year was it founded?"), and most questions are not about versions. "always" and "never"
force it either way, so the change is measured (docs/statistics.md).

Citations come from the model's text when it writes valid keys (`cited_by="model"`); a
model too small to cite gets citations attributed afterwards: the passages sharing the most
answer words that are not in the question (`cited_by="attributed"`). The two are reported
apart, so a score never mixes them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ctxlab.errors import CtxlabError
from ctxlab.memory.backend import Backend
from ctxlab.memory.scoring import normalize
from ctxlab.rag.retriever import Passage

ANSWER_SYSTEM = (
    "Answer the question in a few words, using only the passages. Each passage ends with "
    "its id and date in brackets. If passages disagree, the one with the newest date is "
    "right."
)
ANSWER_SYSTEM_PLAIN = (
    "Answer the question in a few words, using only the passages. Each passage ends with "
    "its id in brackets."
)
METADATA = ("auto", "always", "never")
_ABOUT_VERSIONS = re.compile(
    r"\b(versions?|latest|newest|current(ly)?|now|still|updated?|updates|changed?|changes|"
    r"dated?|as of|recent(ly)?|previous(ly)?|former(ly)?|outdated|superseded|anymore)\b",
    re.IGNORECASE,
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
    seconds: dict[str, float] = field(default_factory=dict)  # phases, where `ask` timed them


def about_versions(question: str) -> bool:
    """Does the question ask about versions or time (so passage dates help answer it)?"""
    return bool(_ABOUT_VERSIONS.search(question))


def check_metadata(metadata: str) -> str:
    if metadata not in METADATA:
        raise CtxlabError(f"--metadata {metadata!r} is unknown; use one of {', '.join(METADATA)}.")
    return metadata


def render_passage(p: Passage, dated: bool = True) -> str:
    """Text first, then `[doc#chunk, date]` (or `[doc#chunk]`): with the id and date in
    front, the 135M model copied them as its answer (a date for "which year", an id for
    "how many")."""
    return f"{p.text} [{p.key}, {p.date}]" if dated else f"{p.text} [{p.key}]"


def answer_chat(
    question: str, passages: Sequence[Passage], metadata: str = "auto"
) -> list[dict[str, str]]:
    dated = check_metadata(metadata) == "always" or (
        metadata == "auto" and about_versions(question)
    )
    body = "\n\n".join(render_passage(p, dated) for p in passages)
    content = f"Passages:\n\n{body}\n\nQuestion: {question}" if passages else question
    system = ANSWER_SYSTEM if dated else ANSWER_SYSTEM_PLAIN
    return [{"role": "system", "content": system}, {"role": "user", "content": content}]


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
    metadata: str = "auto",
) -> list[Answer]:
    """Answer each question from its passages (one batch through the backend)."""
    chats = [answer_chat(q, ps, metadata) for q, ps in zip(questions, passages, strict=True)]
    replies = backend.generate(chats, max_tokens) if chats else []
    out = []
    for q, ps, reply in zip(questions, passages, replies, strict=True):
        citations, how = cite(reply.text, q, ps)
        out.append(Answer(q, reply.text, citations, how, list(ps), reply.prompt_tokens))
    return out
