"""A conversation message as memory keeps it: role and text plus where and when it was said.

`id` is the message's row in recall memory once stored; `session` and `created_at` let
recall search filter by session and date. A turn starts at a user message and runs to the
next one; eviction cuts only there, so a reply never loses the question it answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_input_file, loads_json, read_text, shown
from ctxlab.outputs import write_text

ROLES = ("system", "user", "assistant", "tool")
_DATE_START = re.compile(r"\d{4}-\d{2}-\d{2}")  # the extended form: sorts as text


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

    Each message needs `role` and `content`; `session` and `created_at` (an ISO 8601 date
    or date-time, YYYY-MM-DD first, since recall filters dates as text) are optional. The
    path must be a regular file: a directory, a FIFO or a symbolic link loop is one sentence
    that says what the path is, and a FIFO is never opened.
    """
    check_input_file(path, "history file", "a JSON lines or JSON file")
    name = shown(path)
    text = read_text(path, "history file").strip()
    if not text:
        raise CtxlabError(f"history file {name} is empty.")
    if text.startswith("["):
        items = loads_json(text, f"history file {name}")
        if not isinstance(items, list):
            raise CtxlabError(f"history file {name} is not JSON lines or a JSON list.")
    else:
        items = _json_lines(text, name)
    if not items:
        raise CtxlabError(f"history file {name} holds no messages.")
    return [_message(item, name, i) for i, item in enumerate(items)]


def _json_lines(text: str, name: str) -> list[object]:
    return [
        loads_json(line, f"history file {name} line {number}")
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]


def check_created_at(value: object, where: str) -> str:
    """`value` as a message date: "" when absent (null or empty), else an ISO 8601 date or
    date-time that starts YYYY-MM-DD; anything else is one sentence naming `where`."""
    if value is None or value == "":
        return ""
    if isinstance(value, str) and _DATE_START.match(value):
        try:
            datetime.fromisoformat(value)
            return value
        except ValueError:
            pass
    raise CtxlabError(
        f"{where} has created_at {value!r}, which is not a date; write YYYY-MM-DD or an "
        "ISO 8601 date-time such as 2024-03-08T09:30:00."
    )


def _message(item: object, name: str, index: int) -> Message:
    if not isinstance(item, dict) or "role" not in item or "content" not in item:
        raise CtxlabError(f"message {index} of {name} needs a role and a content.")
    role, content = item["role"], item["content"]
    if role not in ROLES:
        raise CtxlabError(
            f"message {index} of {name} has role {role!r}; use one of {', '.join(ROLES)}."
        )
    if not isinstance(content, str):
        raise CtxlabError(f"message {index} of {name} has a content that is not text.")
    return Message(
        role=role,
        content=content,
        session=str(item.get("session", "default")),
        created_at=check_created_at(item.get("created_at"), f"message {index} of {name}"),
    )


def write_history(messages: Sequence[Message], path: Path) -> None:
    """JSON lines, one message each (without store ids)."""
    lines = [
        json.dumps({k: v for k, v in m.as_dict().items() if k != "id"}, ensure_ascii=False)
        for m in messages
    ]
    write_text(path, "\n".join(lines) + "\n")  # whole or absent (ctxlab.outputs)
