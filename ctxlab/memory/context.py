"""What the model sees: one system message (instructions, core memory, the strategy's note),
the messages still in context, and recalled messages just before the newest user turn.

Recalled messages sit next to the question rather than at the top, where a small model
attends to them least; the note can sit there too (`note_position="turn"`). Assembly is
pure; counting it is the backend's job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ctxlab.memory.messages import Message


@dataclass
class ContextState:
    """The mutable part of a context: what a strategy may change."""

    messages: list[Message] = field(default_factory=list)
    note: str = ""  # summary or recall note written by the strategy
    retrieved: list[Message] = field(default_factory=list)  # for the current user turn
    evicted_total: int = 0

    def copy(self) -> ContextState:
        return ContextState(
            list(self.messages), self.note, list(self.retrieved), self.evicted_total
        )


def render_retrieved(messages: Sequence[Message]) -> str:
    """Recalled messages as plain sentences (a small model copies list markup verbatim)."""
    lines = ["Earlier messages that may help:"]
    for m in messages:
        when = f"On {m.created_at[:10]} the " if m.created_at else "The "
        lines.append(f"{when}{m.role} said: {m.content}")
    return "\n".join(lines)


def assemble(
    system_prompt: str,
    core_text: str,
    note: str,
    messages: Sequence[Message],
    retrieved: Sequence[Message] = (),
    note_position: str = "system",
) -> list[dict[str, str]]:
    """The chat sent to the model.

    `note_position="system"` keeps the strategy's note in the system message (a stable
    prefix between compactions, so a prefix cache keeps it); `"turn"` puts it with the
    recalled messages just before the newest user message, where a small model uses it
    best, at the price of a prefix that changes every turn.
    """
    system = system_prompt
    if core_text:
        system += "\n\nCore memory:\n" + core_text
    if note and note_position == "system":
        system += "\n\n" + note
    near = [note] if note and note_position != "system" else []
    if retrieved:
        near.append(render_retrieved(retrieved))
    chat = [{"role": "system", "content": system}]
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    for i, m in enumerate(messages):
        if i == last_user and near:
            chat.append({"role": "system", "content": "\n\n".join(near)})
        chat.append(m.chat())
    if last_user < 0 and near:
        chat.append({"role": "system", "content": "\n\n".join(near)})
    return chat


def context_text(chat: Sequence[dict[str, str]]) -> str:
    """All the text of a chat, for checking what it still contains."""
    return "\n".join(m["content"] for m in chat)
