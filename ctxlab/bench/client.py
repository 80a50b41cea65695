"""One streamed request to an OpenAI-compatible server, timed as `vllm bench serve` times it.

Only the public API is used (`/v1/completions` or `/v1/chat/completions`, `stream: true`,
`stream_options.include_usage`), so vLLM, SGLang, llama.cpp's server and `ctxlab serve` are
measured the same way. `ignore_eos` is sent only when asked for (a vLLM extension that
SGLang and llama.cpp also read).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ctxlab.bench.metrics import RequestResult

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

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

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
    or network failure: the result says `success=False` and why. `timeout` overrides the
    client's seconds of silence allowed (the test request waits less than a real one)."""
    clock = time.perf_counter
    st = clock()
    result.start = st - t0
    last = st
    text: list[str] = []
    try:
        extra = {} if timeout is None else {"timeout": httpx.Timeout(timeout)}
        async with client.stream(
            "POST", ep.url, json=ep.payload(prompt, max_tokens), headers=ep.headers(), **extra
        ) as r:
            if r.status_code != 200:
                body = (await r.aread()).decode(errors="replace")
                result.error = f"HTTP {r.status_code}: {_message(body)}"
                return result
            async for line in r.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                doc = json.loads(data)
                now = clock()
                if "error" in doc:
                    result.error = _message(json.dumps(doc))
                    return result
                choices = doc.get("choices") or []
                if choices:
                    c = choices[0]
                    piece = (c.get("delta") or {}).get("content") if ep.chat else c.get("text")
                    if piece:
                        if not text:
                            result.ttft = now - st
                        else:
                            result.itl.append(now - last)
                        last = now
                        text.append(piece)
                    elif text:
                        last = now  # a finish chunk without text still ends the answer
                usage = doc.get("usage")
                if usage:
                    result.output_tokens = usage.get("completion_tokens")
                    result.prompt_tokens = usage.get("prompt_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    if details.get("cached_tokens") is not None:
                        result.cached_tokens = int(details["cached_tokens"])
    except httpx.TimeoutException as exc:
        result.error = f"{TIMED_OUT} ({type(exc).__name__})"
        return result
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.text = "".join(text)
    result.chunks = len(text)
    result.latency = last - st
    if not text:
        result.error = "the server sent no text chunk, so there is no TTFT"
        return result
    result.success = True
    return result


def _message(body: str) -> str:
    """The `error.message` of an OpenAI error body, else the body's start."""
    try:
        doc = json.loads(body)
        msg = doc.get("error", {}).get("message") if isinstance(doc, dict) else None
        if isinstance(msg, str):
            return msg
    except json.JSONDecodeError:
        pass
    return body[:300]
