"""A hostile or broken OpenAI-compatible server (standard library, in a thread, on
127.0.0.1) for the peer tests: every answer is scripted, so a test can make one field the
wrong type, one value impossible, or the whole answer slow in a chosen way.

`Script` says how it answers. By default it is a well-behaved server with one model "m"
that counts prompt words as tokens; a test changes one thing. `hang` applies to the
completion and chat endpoints: "silent" (accepts, never answers), "silent-body" (headers,
then nothing), "trickle" (headers, then one byte every 0.2 s, forever) or "keepalive" (an
SSE keep-alive comment every 0.2 s, forever). A hanging handler stops when the client goes
away or the server is closed.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "hostile"}]}


def words(body: dict[str, Any]) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    prompt = body.get("prompt", "")
    return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())


def good_events(body: dict[str, Any]) -> list[object]:
    """A correct stream: two text chunks, then usage (the probe's and bench's shape)."""
    n = words(body)
    chat = "messages" in body
    piece = (lambda t: {"delta": {"content": t}}) if chat else (lambda t: {"text": t})
    return [
        {"choices": [{"index": 0, **piece(" x")}]},
        {"choices": [{"index": 0, **piece(" y"), "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": n, "completion_tokens": 2,
                                  "prompt_tokens_details": {"cached_tokens": 0}}},
    ]  # fmt: skip


def good_reply(body: dict[str, Any]) -> object:
    """A correct whole chat answer."""
    n = words(body)
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Ada Stone"}}],
        "usage": {"prompt_tokens": n, "completion_tokens": 2},
    }


@dataclass
class Script:
    """How the server answers (each a function of the request body, so a value can depend
    on the prompt); None for an endpoint it does not have (404)."""

    models: object = field(default_factory=lambda: MODELS)
    events: Callable[[dict[str, Any]], list[object]] = good_events  # streamed answers
    reply: Callable[[dict[str, Any]], object] = good_reply  # whole chat answers
    tokenize: object | None = None
    props: object | None = None
    metrics: str | None = None
    status: int = 200  # for every POST (an error body when not 200)
    status_for: Callable[[dict[str, Any]], int] | None = None  # a completion's status by body
    fail_after: int | None = None  # answer HTTP 500 after this many POSTs
    key: str | None = None  # the Bearer key it requires (401 otherwise)
    hang: str | None = None  # silent, silent-body, trickle, keepalive
    hang_after: int = 0  # POSTs answered well before the hanging starts
    posts: list[str] = field(default_factory=list)  # every POST path, in order
    auth: list[str | None] = field(default_factory=list)  # every Authorization header


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: Script
    closing: threading.Event

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: object, kind: str = "application/json") -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self) -> bool:
        s = self.script
        s.auth.append(self.headers.get("Authorization"))
        if s.key is not None and self.headers.get("Authorization") != f"Bearer {s.key}":
            self._send(401, {"error": {"message": "invalid api key", "code": 401}})
            return True
        return False

    def do_GET(self) -> None:
        s = self.script
        if self._refuse():
            return
        path = self.path.split("?")[0]
        found = {"/v1/models": s.models, "/props": s.props}.get(path)
        if path == "/metrics" and s.metrics is not None:
            self._send(200, s.metrics, "text/plain")
        elif found is not None:
            self._send(200, found)
        else:
            self._send(404, "<html>not found</html>", "text/html")

    def do_POST(self) -> None:
        s = self.script
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        s.posts.append(self.path)
        if self._refuse():
            return
        if self.path == "/tokenize":
            if s.tokenize is None:
                self._send(404, "<html>not found</html>", "text/html")
            else:
                self._send(200, s.tokenize)
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, "<html>not found</html>", "text/html")
            return
        failing = s.fail_after is not None and len(s.posts) > s.fail_after
        chosen = s.status_for(body) if s.status_for is not None else 200
        if s.status != 200 or failing or chosen != 200:
            status = next((c for c in (s.status, chosen) if c != 200), 500)
            self._send(status, {"error": {"message": "scripted failure", "code": status}})
            return
        if s.hang is not None and len(s.posts) > s.hang_after:
            self._hang(s.hang)
            return
        if body.get("stream"):
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in s.events(body))
            self._send(200, text + "data: [DONE]\n\n", "text/event-stream")
        else:
            self._send(200, s.reply(body))

    def _hang(self, how: str) -> None:
        self.close_connection = True
        if how != "silent":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            self.wfile.flush()
        drip = {"trickle": b"d", "keepalive": b": keep-alive\n\n"}.get(how)
        while not self.closing.wait(0.2):
            if drip is None:
                continue
            try:
                self.wfile.write(drip)
                self.wfile.flush()
            except OSError:
                return  # the client gave up


@contextlib.contextmanager
def hostile(script: Script | None = None) -> Iterator[tuple[str, Script]]:
    """Serve `script` on a free loopback port; yield (root URL, script)."""
    script = script or Script()
    closing = threading.Event()
    handler = type("H", (_Handler,), {"script": script, "closing": closing})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    finally:
        closing.set()
        httpd.shutdown()
        httpd.server_close()
        time.sleep(0.05)  # let hanging handlers see `closing`


def with_secret(url: str, secret: str) -> str:
    """`url` with a user and password in it."""
    return url.replace("http://", f"http://alice:{secret}@", 1)
