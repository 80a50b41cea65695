"""One streamed request to an OpenAI-compatible server, timed as `vllm bench serve` times it.

Only the public API is used (`/v1/completions` or `/v1/chat/completions`, `stream: true`,
`stream_options.include_usage`), so vLLM, SGLang, llama.cpp's server and `ctxlab serve` are
measured the same way. `ignore_eos` is sent only when asked for (a vLLM extension that
SGLang and llama.cpp also read).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ctxlab.bench.metrics import RequestResult
from ctxlab.peer import fields
from ctxlab.peer.deadline import Deadline
from ctxlab.peer.fields import BadAnswer, Source
from ctxlab.peer.key import bearer
from ctxlab.peer.sse import DONE, event
from ctxlab.peer.url import public, redact

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    path: str
    model: str
    api_key: str | None = None
    ignore_eos: bool = False

    @property
    def chat(self) -> bool:
        return self.path.rstrip("/").endswith("chat/completions")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + self.path

    @property
    def shown(self) -> str:
        """The URL as printed and written: no credentials."""
        return redact(public(self.base_url)) + self.path

    def headers(self) -> dict[str, str]:
        return {"Content-Type": "application/json", **bearer(self.api_key)}

    def payload(self, prompt: str | list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.chat:
            msgs = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            body["messages"] = msgs
        else:
            body["prompt"] = prompt
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


TIMED_OUT = "no answer within the timeout"


async def send(
    client: httpx.AsyncClient,
    ep: Endpoint,
    prompt: str | list[dict[str, str]],
    max_tokens: int,
    result: RequestResult,
    t0: float,
    timeout: float | None = None,
) -> RequestResult:
    """Stream one request into `result` (times relative to `t0`); never raises for a server
    or network failure: the result says `success=False` and why. The request is bounded in
    total (`timeout`, else the client's read timeout): a server that trickles bytes or
    streams keep-alives is cut at the deadline like one that is silent."""
    seconds = timeout if timeout is not None else (client.timeout.read or 600.0)
    deadline = Deadline(seconds)
    try:
        async with asyncio.timeout(seconds):
            await _stream(client, ep, prompt, max_tokens, result, t0, deadline)
    except (TimeoutError, httpx.TimeoutException) as exc:
        why = "total deadline" if isinstance(exc, TimeoutError) else type(exc).__name__
        result.error = f"{TIMED_OUT} of {seconds:g} s ({why})"
        result.success = False
    except BadAnswer as exc:
        result.error = str(exc)
        result.success = False
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {redact(str(exc))}"
        result.success = False
    return result


async def _stream(
    client: httpx.AsyncClient,
    ep: Endpoint,
    prompt: str | list[dict[str, str]],
    max_tokens: int,
    result: RequestResult,
    t0: float,
    deadline: Deadline,
) -> None:
    clock = time.perf_counter
    st = clock()
    result.start = st - t0
    last = st
    text: list[str] = []
    src = Source(ep.base_url, f"POST {ep.path}")
    counted = None
    async with client.stream(
        "POST", ep.url, json=ep.payload(prompt, max_tokens), headers=ep.headers(),
        timeout=deadline.timeout(),
    ) as r:  # fmt: skip
        if r.status_code != 200:
            body = (await r.aread()).decode(errors="replace")
            result.error = f"HTTP {r.status_code}: {_message(body)}"
            return
        async for line in r.aiter_lines():
            doc = event(src, line)
            if doc == DONE:
                break
            if not isinstance(doc, dict):
                continue
            now = clock()
            message = fields.error_message(doc)
            if message is not None:
                result.error = message
                return
            piece = fields.choice_text(src, doc, ep.chat)
            if piece:
                if not text:
                    result.ttft = now - st
                else:
                    result.itl.append(now - last)
                last = now
                text.append(piece)
            elif text and doc.get("choices"):
                last = now  # a finish chunk without text still ends the answer
            if doc.get("usage") is not None:
                counted = fields.usage(src, doc["usage"])
    if counted is not None:
        result.output_tokens = counted.completion_tokens
        result.prompt_tokens = counted.prompt_tokens
        result.cached_tokens = counted.cached_tokens
    result.text = "".join(text)
    result.chunks = len(text)
    result.latency = last - st
    if not text:
        result.error = "the server sent no text chunk, so there is no TTFT"
        return
    result.success = True


def _message(body: str) -> str:
    """The `error.message` of an OpenAI error body, else the body's start."""
    try:
        doc = json.loads(body)
    except json.JSONDecodeError:
        doc = None
    found = fields.error_message(doc) if isinstance(doc, dict) else None
    return found if found is not None else redact(body[:300])
