"""A conversation message as memory keeps it: role and text plus where and when it was said.

`id` is the message's row in recall memory once stored; `session` and `created_at` let
recall search filter by session and date. A turn starts at a user message and runs to the
next one; eviction cuts only there, so a reply never loses the question it answers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.inputs import loads_json, read_text

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    session: str = "default"
    created_at: str = ""
    id: int | None = None

    def chat(self) -> dict[str, str]:
        """The message as a chat-template entry."""
        return {"role": self.role, "content": self.content}

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """Indices where a turn begins (each user message); index 0 always counts as one."""
    starts = [i for i, m in enumerate(messages) if m.role == "user"]
    return starts if starts and starts[0] == 0 else [0, *starts]


def read_history(path: Path) -> list[Message]:
    """A history file: JSON lines (one message each) or one JSON list of messages.

    Each message needs `role` and `content`; `session` and `created_at` are optional.
    """
    if not path.is_file():
        raise CtxlabError(f"history file {path} does not exist.")
    text = read_text(path, "history file").strip()
    if not text:
        raise CtxlabError(f"history file {path} is empty.")
    if text.startswith("["):
        items = loads_json(text, f"history file {path}")
        if not isinstance(items, list):
            raise CtxlabError(f"history file {path} is not JSON lines or a JSON list.")
    else:
        items = _json_lines(text, path)
    if not items:
        raise CtxlabError(f"history file {path} holds no messages.")
    return [_message(item, path, i) for i, item in enumerate(items)]


def _json_lines(text: str, path: Path) -> list[object]:
    return [
        loads_json(line, f"history file {path} line {number}")
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]


def _message(item: object, path: Path, index: int) -> Message:
    if not isinstance(item, dict) or "role" not in item or "content" not in item:
        raise CtxlabError(f"message {index} of {path} needs a role and a content.")
    role, content = item["role"], item["content"]
    if role not in ROLES:
        raise CtxlabError(
            f"message {index} of {path} has role {role!r}; use one of {', '.join(ROLES)}."
        )
    if not isinstance(content, str):
        raise CtxlabError(f"message {index} of {path} has a content that is not text.")
    return Message(
        role=role,
        content=content,
        session=str(item.get("session", "default")),
        created_at=str(item.get("created_at", "")),
    )


def write_history(messages: Sequence[Message], path: Path) -> None:
    """JSON lines, one message each (without store ids)."""
    lines = [
        json.dumps({k: v for k, v in m.as_dict().items() if k != "id"}, ensure_ascii=False)
        for m in messages
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
