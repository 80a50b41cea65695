"""The probe's one way to talk to a server: streamed `/v1/completions` requests, counted
against the run's budget, each answer read for what a cache figure needs.

Per request it keeps the server's `usage.prompt_tokens`, the cached prompt tokens (from
`usage.prompt_tokens_details.cached_tokens`, else llama.cpp's `timings.cache_n`, with the
source named), the client-side TTFT and the arrival time of every text chunk. A failure is
classified once, here, into one sentence: unreachable, a refused key, a server that is not
OpenAI-compatible, a model it does not serve, or a server that stopped answering.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from ctxlab.errors import CtxlabError


class BudgetSpent(Exception):
    """The next request would pass --max-requests, --max-tokens or --max-seconds."""


class ServerGone(Exception):
    """The server stopped answering after it had answered before (died mid-run)."""


@dataclass
class Budget:
    """Caps on what the probe sends; every request is counted before it is sent."""

    max_requests: int
    max_tokens: int
    max_seconds: float = float("inf")
    requests: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self, prompt_tokens: int) -> None:
        with self.lock:  # parallel decode requests draw from one budget
            over = self.tokens + prompt_tokens > self.max_tokens
            if self.requests + 1 > self.max_requests or over:
                raise BudgetSpent
            if time.monotonic() - self.started > self.max_seconds:
                raise BudgetSpent
            self.requests += 1
            self.tokens += prompt_tokens

    def left(self) -> tuple[int, int]:
        return self.max_requests - self.requests, self.max_tokens - self.tokens


@dataclass
class Answer:
    """One completed request as the probe saw it."""

    prompt_tokens: int
    cached_tokens: int | None
    cached_source: str  # "usage.prompt_tokens_details.cached_tokens", "timings.cache_n" or ""
    ttft: float
    chunk_times: list[float] = field(default_factory=list)  # perf_counter of each text chunk
    output_tokens: int = 0
    sent_at: float = 0.0
    text: str = ""


class ProbeClient:
    """A synchronous client over one server, safe for a few parallel streams (httpx
    clients are, and the budget takes a lock)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        budget: Budget,
        timeout: float = 120.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.budget = budget
        self.answered = 0  # requests the server answered: after one, a failure is "died"
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        self.http = httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0), limits=limits)

    def close(self) -> None:
        self.http.close()

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def get(self, path: str) -> httpx.Response | None:
        """A GET of an optional endpoint; None when the server is unreachable for it."""
        try:
            return self.http.get(self.base_url + path, headers=self.headers(), timeout=10.0)
        except httpx.HTTPError:
            return None

    def complete(
        self,
        prompt: str | list[int],
        planned_tokens: int,
        max_tokens: int = 1,
        salt: str | None = None,
        ignore_eos: bool = False,
        temperature: float = 0.0,
    ) -> Answer:
        """Send one streamed completion (text or token ids); raises BudgetSpent, ServerGone
        or CtxlabError."""
        self.budget.take(planned_tokens)
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if salt is not None:
            body["cache_salt"] = salt
        if ignore_eos:
            body["ignore_eos"] = True
        clock = time.perf_counter
        start = clock()
        chunks: list[float] = []
        pieces: list[str] = []
        usage: dict[str, Any] = {}
        timings: dict[str, Any] = {}
        try:
            with self.http.stream(
                "POST", self.base_url + "/v1/completions", json=body, headers=self.headers()
            ) as r:
                if r.status_code != 200:
                    raise self._refused(r.status_code, r.read().decode(errors="replace"))
                for line in r.iter_lines():
                    line = line.strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    doc = json.loads(data)
                    if isinstance(doc, dict) and "error" in doc:
                        raise CtxlabError(f"the server failed a request: {_message(doc)}")
                    now = clock()
                    for c in doc.get("choices") or []:
                        if c.get("text"):
                            chunks.append(now)
                            pieces.append(c["text"])
                    usage = doc.get("usage") or usage
                    timings = doc.get("timings") or timings
        except httpx.HTTPError as exc:
            raise self._transport(exc) from None
        except json.JSONDecodeError:
            raise CtxlabError(
                f"{self.base_url} answered /v1/completions with something that is not "
                "OpenAI's stream format (server-sent JSON events)"
            ) from None
        self.answered += 1
        if not usage.get("prompt_tokens"):
            raise CtxlabError(
                f"{self.base_url} does not report usage.prompt_tokens in streamed answers "
                "(stream_options.include_usage), which the probe needs to count tokens"
            )
        details = usage.get("prompt_tokens_details") or {}
        cached, source = None, ""
        if details.get("cached_tokens") is not None:
            cached, source = int(details["cached_tokens"]), "usage.prompt_tokens_details"
        elif timings.get("cache_n") is not None:
            cached, source = int(timings["cache_n"]), "timings.cache_n"
        return Answer(
            prompt_tokens=int(usage["prompt_tokens"]),
            cached_tokens=cached,
            cached_source=source,
            ttft=(chunks[0] - start) if chunks else clock() - start,
            chunk_times=chunks,
            output_tokens=int(usage.get("completion_tokens") or len(chunks)),
            sent_at=start,
            text="".join(pieces),
        )

    def _transport(self, exc: httpx.HTTPError) -> Exception:
        if self.answered and isinstance(exc, httpx.TimeoutException):
            return ServerGone(
                f"one request got no answer within {self.http.timeout.read:g} s "
                f"({type(exc).__name__}); the server is overloaded or stuck"
            )
        if self.answered:
            return ServerGone(f"{type(exc).__name__}: {exc}")
        return CtxlabError(f"cannot reach {self.base_url}: {type(exc).__name__} ({exc})")

    def _refused(self, status: int, body: str) -> Exception:
        msg = _message_text(body)
        if status == 401 or status == 403:
            return CtxlabError(
                f"{self.base_url} refused the API key (HTTP {status}: {msg}); give the "
                "right one with --api-key"
            )
        low = msg.lower()
        unknown = any(w in low for w in ("not found", "does not exist", "not served", "no model"))
        if status in (400, 404) and "model" in low and unknown:
            return CtxlabError(f"{self.base_url} does not serve model {self.model!r}: {msg}")
        if status == 404:
            return CtxlabError(
                f"{self.base_url} has no /v1/completions (HTTP 404): it is not an "
                "OpenAI-compatible server, or the URL should not end in /v1"
            )
        if status >= 500 and self.answered:
            return ServerGone(f"HTTP {status}: {msg}")
        return CtxlabError(f"{self.base_url} refused a probe request (HTTP {status}: {msg})")


def _message(doc: dict[str, Any]) -> str:
    err = doc.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    return str(err or doc)[:300]


def _message_text(body: str) -> str:
    try:
        doc = json.loads(body)
    except json.JSONDecodeError:
        return body.strip()[:200] or "no body"
    return _message(doc) if isinstance(doc, dict) else body[:200]
