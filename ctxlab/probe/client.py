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
from ctxlab.peer import fields
from ctxlab.peer.deadline import Deadline, DeadlinePassed, Reply, lines, request, stream
from ctxlab.peer.sse import events
from ctxlab.peer.url import base_url as root_url
from ctxlab.peer.url import public, redact


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

    def seconds_left(self) -> float:
        return self.max_seconds - (time.monotonic() - self.started)


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
    clients are, and the budget takes a lock). Every request has a total deadline: the
    request timeout, or what --max-seconds leaves when that is shorter."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        budget: Budget,
        timeout: float = 120.0,
    ) -> None:
        self.base_url = root_url(base_url, "--server")
        self.url = redact(public(self.base_url))  # the server as printed: no credentials
        self.model = model
        self.api_key = api_key
        self.budget = budget
        self.timeout = timeout  # seconds in total for one request
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

    def deadline(self, cap: float | None = None) -> Deadline:
        """One request's deadline: `cap` (else the request timeout), within --max-seconds."""
        seconds = min(self.timeout if cap is None else cap, self.budget.seconds_left())
        return Deadline(max(0.001, seconds))

    def source(self, endpoint: str) -> fields.Source:
        return fields.Source(self.base_url, endpoint)

    def get(self, path: str, cap: float = 10.0) -> Reply | None:
        """A GET of an optional endpoint; None when the server does not answer it in time."""
        try:
            return request(
                self.http, "GET", self.base_url + path, self.deadline(cap), headers=self.headers()
            )
        except httpx.HTTPError:
            return None

    def post(self, path: str, body: dict[str, Any], cap: float = 10.0) -> Reply:
        """A POST whose whole answer is read within `cap` s (raises httpx.HTTPError)."""
        return request(
            self.http, "POST", self.base_url + path, self.deadline(cap),
            json=body, headers=self.headers(),
        )  # fmt: skip

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
        usage: object = None
        timings: object = None
        src = self.source("POST /v1/completions")
        deadline = self.deadline()
        try:
            with stream(
                self.http, "POST", self.base_url + "/v1/completions", deadline,
                json=body, headers=self.headers(),
            ) as r:  # fmt: skip
                if r.status_code != 200:
                    text = b"".join(r.iter_bytes()).decode(errors="replace")
                    raise self._refused(r.status_code, text)
                for doc in events(src, lines(r, deadline)):
                    message = fields.error_message(doc)
                    if message is not None:
                        raise CtxlabError(f"the server failed a request: {message}")
                    now = clock()
                    piece = fields.choice_text(src, doc, chat=False)
                    if piece:
                        chunks.append(now)
                        pieces.append(piece)
                    usage = doc.get("usage") or usage
                    timings = doc.get("timings") or timings
        except DeadlinePassed as exc:
            if deadline.seconds < self.timeout and self.budget.seconds_left() <= 0:
                raise BudgetSpent from None  # --max-seconds ran out while it waited
            raise self._transport(exc) from None
        except httpx.HTTPError as exc:
            raise self._transport(exc) from None
        self.answered += 1
        counted = fields.usage(src, usage, timings)
        if not counted.prompt_tokens:
            raise CtxlabError(
                f"{self.url} does not report usage.prompt_tokens in streamed answers "
                "(stream_options.include_usage), which the probe needs to count tokens"
            )
        return Answer(
            prompt_tokens=counted.prompt_tokens,
            cached_tokens=counted.cached_tokens,
            cached_source=counted.cached_source.removesuffix(".cached_tokens"),
            ttft=(chunks[0] - start) if chunks else clock() - start,
            chunk_times=chunks,
            output_tokens=counted.completion_tokens or len(chunks),
            sent_at=start,
            text="".join(pieces),
        )

    def _transport(self, exc: httpx.HTTPError) -> Exception:
        if self.answered and isinstance(exc, httpx.TimeoutException):
            return ServerGone(
                f"one request got no complete answer within {self.timeout:g} s "
                f"({type(exc).__name__}); the server is overloaded or stuck"
            )
        if isinstance(exc, httpx.TimeoutException):
            return CtxlabError(
                f"{self.url} accepted a request but gave no complete answer within "
                f"{self.timeout:g} s ({type(exc).__name__}); is it stuck or overloaded?"
            )
        if self.answered:
            return ServerGone(f"{type(exc).__name__}: {redact(str(exc))}")
        return CtxlabError(f"cannot reach {self.url}: {type(exc).__name__} ({redact(str(exc))})")

    def _refused(self, status: int, body: str) -> Exception:
        msg = redact(_message_text(body))
        if status == 401 or status == 403:
            return CtxlabError(
                f"{self.url} refused the API key (HTTP {status}: {msg}); give the "
                "right one with --api-key"
            )
        low = msg.lower()
        unknown = any(w in low for w in ("not found", "does not exist", "not served", "no model"))
        if status in (400, 404) and "model" in low and unknown:
            return CtxlabError(f"{self.url} does not serve model {self.model!r}: {msg}")
        if status == 404:
            return CtxlabError(
                f"{self.url} has no /v1/completions (HTTP 404): it is not an "
                "OpenAI-compatible server, or its root is not this URL"
            )
        if status >= 500 and self.answered:
            return ServerGone(f"HTTP {status}: {msg}")
        return CtxlabError(f"{self.url} refused a probe request (HTTP {status}: {msg})")


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
