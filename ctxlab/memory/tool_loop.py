"""The tool-calling loop for models that can call tools (OpenAI-compatible servers).

Send the chat with `TOOL_SCHEMAS`; while the model answers with tool calls, run them with
`MemoryTools.call`, append the assistant's call message and one `tool` message per result,
and ask again, at most `max_steps` rounds. The default model cannot call tools, so
`MemoryAgent`'s deterministic loop stands in for this there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ctxlab.memory.openai_backend import OpenAIChatBackend
from ctxlab.memory.tools import TOOL_SCHEMAS, MemoryTools


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    result: str


@dataclass
class ToolRun:
    text: str
    calls: list[ToolCall] = field(default_factory=list)
    steps: int = 0
    finished: bool = True  # False when max_steps ran out while the model still called tools


def run_with_tools(
    backend: OpenAIChatBackend,
    tools: MemoryTools,
    chat: list[dict[str, Any]],
    max_steps: int = 5,
    max_tokens: int = 256,
) -> ToolRun:
    messages = list(chat)
    run = ToolRun("")
    for step in range(1, max_steps + 1):
        run.steps = step
        message = backend.chat(messages, max_tokens, tools=TOOL_SCHEMAS)["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        if not calls:
            run.text = (message.get("content") or "").strip()
            return run
        messages.append(
            {"role": "assistant", "content": message.get("content") or "", "tool_calls": calls}
        )
        for call in calls:
            fn = call.get("function") or {}
            name, arguments = str(fn.get("name", "")), fn.get("arguments") or "{}"
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            result = tools.call(name, arguments)
            run.calls.append(ToolCall(name, arguments, result))
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
    run.finished = False
    return run
