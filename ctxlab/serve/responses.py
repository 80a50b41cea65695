"""OpenAI response bodies and SSE chunks, built from the engine's outputs.

Usage always carries `prompt_tokens_details.cached_tokens`: the prompt tokens the prefix
cache served at admission. A streamed answer is `data: {chunk}` lines, then (with
`stream_options.include_usage`) one chunk with empty `choices` and the usage, then
`data: [DONE]`. The first chat chunk carries the role together with the first text, so the
first chunk a client sees is also its first content.

With vLLM's `stream_options.continuous_usage_stats` (and `include_usage`) every text chunk
carries the running usage of its prompt as vLLM fills it: `prompt_tokens` (that prompt's),
`completion_tokens` (its output tokens so far, the finishing chunk's being the final count)
and `total_tokens`; no `prompt_tokens_details` (vLLM's per-chunk usage has none), which the
last usage chunk still carries.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ctxlab.engine.request import RequestOutput


def usage(outputs: list[RequestOutput]) -> dict[str, Any]:
    prompt = sum(o.metrics.prompt_tokens for o in outputs)
    completion = sum(o.metrics.output_tokens for o in outputs)
    cached = sum(o.metrics.reused_tokens for o in outputs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def finish_reason(out: RequestOutput) -> str:
    return "stop" if out.finish_reason == "stop" else "length"


@dataclass
class Reply:
    """What every body and chunk of one HTTP request shares."""

    model: str
    chat: bool
    include_usage: bool = False
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (with include_usage)
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    # -- whole answers ------------------------------------------------------------------
    def body(self, texts: list[str], outputs: list[RequestOutput]) -> dict[str, Any]:
        if self.chat:
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish_reason(o),
                }
                for i, (text, o) in enumerate(zip(texts, outputs, strict=True))
            ]
            return {**self._head("chat.completion"), "choices": choices, "usage": usage(outputs)}
        choices = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": finish_reason(o)}
            for i, (text, o) in enumerate(zip(texts, outputs, strict=True))
        ]
        return {**self._head("text_completion"), "choices": choices, "usage": usage(outputs)}

    # -- stream chunks --------------------------------------------------------------------
    def chunk(
        self,
        index: int,
        text: str,
        first: bool,
        reason: str | None = None,
        counts: tuple[int, int] = (0, 0),
    ) -> str:
        """One text chunk; `counts`: its prompt's (prompt, output tokens so far), written
        when the client asked for continuous usage."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text or first:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
            doc = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
            doc = {**self._head("text_completion"), "choices": [choice]}
        if self.continuous_usage:
            prompt, completion = counts
            doc["usage"] = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
        elif self.include_usage:
            doc["usage"] = None
        return sse(doc)

    def usage_chunk(self, outputs: list[RequestOutput]) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return sse({**self._head(obj), "choices": [], "usage": usage(outputs)})


def sse(doc: dict[str, Any]) -> str:
    return f"data: {json.dumps(doc, separators=(',', ':'))}\n\n"


DONE = "data: [DONE]\n\n"
