"""Memory tools for models that call tools, with the names and arguments Letta users know.

core_memory_append(label, content), core_memory_replace(label, old_content, new_content),
archival_memory_insert(content, tags), archival_memory_search(query, page, tags, top_k),
conversation_search(query, roles, page, start_date, end_date). `TOOL_SCHEMAS` are the
OpenAI function schemas to send with a request; `MemoryTools.call(name, arguments)` runs
one call and returns text for the model. A mistake in a call (an unknown block, text over
a block's limit) comes back to the model as an "Error: ..." sentence, as Letta does, so
the model can correct itself; it never raises into the loop.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ctxlab.errors import CtxlabError
from ctxlab.inputs import loads_json
from ctxlab.memory.archival import ArchivalMemory
from ctxlab.memory.core import CoreMemory
from ctxlab.memory.recall import RecallMemory


def _fn(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


_STR = {"type": "string"}
_PAGE = {"type": "integer", "description": "Result page, from 0.", "minimum": 0}
_TAGS = {"type": "array", "items": _STR, "description": "Tags; results must carry all of them."}

TOOL_SCHEMAS: list[dict[str, Any]] = [
    _fn(
        "core_memory_append",
        "Add a line to a block of core memory (always visible in the prompt).",
        {
            "label": {**_STR, "description": "The block to edit, e.g. 'human' or 'persona'."},
            "content": {**_STR, "description": "Text to add at the end of the block."},
        },
        ["label", "content"],
    ),
    _fn(
        "core_memory_replace",
        "Replace text inside a block of core memory; an empty new_content deletes it.",
        {
            "label": {**_STR, "description": "The block to edit."},
            "old_content": {**_STR, "description": "Exact text currently in the block."},
            "new_content": {**_STR, "description": "Text to put in its place."},
        },
        ["label", "old_content", "new_content"],
    ),
    _fn(
        "archival_memory_insert",
        "Store a passage in archival memory for later search (not shown in the prompt).",
        {"content": {**_STR, "description": "The passage to store."}, "tags": _TAGS},
        ["content"],
    ),
    _fn(
        "archival_memory_search",
        "Search archival memory by meaning and keywords.",
        {
            "query": {**_STR, "description": "What to look for."},
            "page": _PAGE,
            "tags": _TAGS,
            "top_k": {"type": "integer", "description": "Results per page.", "minimum": 1},
        },
        ["query"],
    ),
    _fn(
        "conversation_search",
        "Search every earlier message of the conversation (recall memory).",
        {
            "query": {**_STR, "description": "What to look for."},
            "roles": {
                "type": "array",
                "items": {"type": "string", "enum": ["user", "assistant", "system", "tool"]},
                "description": "Only messages by these roles.",
            },
            "page": _PAGE,
            "start_date": {**_STR, "description": "Earliest date, YYYY-MM-DD."},
            "end_date": {**_STR, "description": "Latest date, YYYY-MM-DD (inclusive)."},
        },
        ["query"],
    ),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOL_SCHEMAS)


class MemoryTools:
    """The tools bound to one agent's tiers."""

    def __init__(
        self,
        core: CoreMemory,
        archival: ArchivalMemory,
        recall: RecallMemory,
        page_size: int = 5,
        retriever: str = "hybrid",
    ) -> None:
        self.core, self.archival, self.recall = core, archival, recall
        self.page_size, self.retriever = page_size, retriever

    def core_memory_append(self, label: str, content: str) -> str:
        block = self.core.append(label, content)
        return f"OK: block {label!r} now holds {len(block.value)} of {block.limit} characters."

    def core_memory_replace(self, label: str, old_content: str, new_content: str) -> str:
        block = self.core.replace(label, old_content, new_content)
        return f"OK: block {label!r} now holds {len(block.value)} of {block.limit} characters."

    def archival_memory_insert(self, content: str, tags: Sequence[str] | None = None) -> str:
        passage = self.archival.insert(content, tags or ())
        return f"OK: stored passage {passage.id}."

    def archival_memory_search(
        self,
        query: str,
        page: int = 0,
        tags: Sequence[str] | None = None,
        top_k: int | None = None,
    ) -> str:
        size = top_k or self.page_size
        found = self.archival.search(
            query, size, self.retriever, tags or (), offset=max(page, 0) * size
        )
        return json.dumps(
            [
                {"id": p.id, "text": p.text, "tags": list(p.tags), "date": p.created_at}
                for p in found
            ]
        )

    def conversation_search(
        self,
        query: str,
        roles: Sequence[str] | None = None,
        page: int = 0,
        start_date: str | None = None,
        end_date: str | None = None,
    ) -> str:
        size = self.page_size
        hits = self.recall.search(
            query, size * (max(page, 0) + 1), self.retriever, roles, None, start_date, end_date
        )[max(page, 0) * size :]
        return json.dumps(
            [{"role": m.role, "content": m.content, "date": m.created_at} for m in hits]
        )

    def call(self, name: str, arguments: str | dict[str, Any]) -> str:
        """Run one tool call; every failure is an 'Error: ...' sentence for the model."""
        if name not in TOOL_NAMES:
            return f"Error: there is no tool {name!r}; the tools are {', '.join(TOOL_NAMES)}."
        try:  # the model's JSON goes through the bounded loader too (depth, NaN, surrogates)
            args = (
                loads_json(arguments, f"the arguments of {name}")
                if isinstance(arguments, str)
                else dict(arguments)
            )
        except CtxlabError as exc:
            return f"Error: {exc}"
        if not isinstance(args, dict):
            return f"Error: the arguments of {name} must be a JSON object."
        try:
            return getattr(self, name)(**args)
        except TypeError as exc:
            return f"Error: wrong arguments for {name} ({exc})."
        except CtxlabError as exc:
            return f"Error: {exc}"
