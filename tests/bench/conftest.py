"""A scripted OpenAI-compatible streaming server (standard library, in a thread) whose timing
and usage are known, so the load generator's definitions can be checked against it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Script:
    """How the fake server answers: a first-chunk delay, then `chunks - 1` more chunks."""

    first_delay: float = 0.15
    gap: float = 0.05
    chunks: int = 5
    cached_tokens: int = 7
    fail_on: set[int] = field(default_factory=set)  # request numbers (0: the probe) to fail
    seen: list[dict[str, Any]] = field(default_factory=list)  # every body received
    arrivals: list[float] = field(default_factory=list)  # perf_counter at each request
    active: int = 0
    peak_active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: Script

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        s = self.script
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with s.lock:
            number = len(s.seen)
            s.arrivals.append(time.perf_counter())
            s.seen.append(body)
            s.active += 1
            s.peak_active = max(s.peak_active, s.active)
        try:
            self._answer(s, body, number)
        finally:
            with s.lock:
                s.active -= 1

    def _answer(self, s: Script, body: dict, number: int) -> None:
        prompt = body.get("prompt") or body["messages"][-1]["content"]
        if number in s.fail_on:
            self._send(500, b'{"error": {"message": "scripted failure", "type": "server_error"}}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        chat = "messages" in body
        n = min(s.chunks, body["max_tokens"])
        try:
            time.sleep(s.first_delay)
            for i in range(n):
                if i:
                    time.sleep(s.gap)
                text = f" t{i}"
                choice = {"index": 0, "delta": {"content": text}} if chat else {"text": text}
                choice["finish_reason"] = "length" if i == n - 1 else None
                self._event({"choices": [choice]})
            usage = {
                "prompt_tokens": len(prompt.split()),
                "completion_tokens": n,
                # never more than the prompt: a client refuses that as impossible
                "prompt_tokens_details": {
                    "cached_tokens": min(s.cached_tokens, len(prompt.split()))
                },
            }
            self._event({"choices": [], "usage": usage})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _event(self, doc: dict) -> None:
        self.wfile.write(f"data: {json.dumps(doc)}\n\n".encode())
        self.wfile.flush()

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def fake_server() -> Iterator[tuple[str, Script]]:
    script = Script()
    handler = type("Handler", (_Handler,), {"script": script})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()
