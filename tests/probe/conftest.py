"""Servers for the probe tests: `ctxlab serve` and llama.cpp's server from the xllamacpp
wheel (tests/servers.py: the session's shared ones, or a test's own), and scripted
stand-ins (standard library, in a thread) for the failures a real server is hard to make on
demand: a refused key, a server that is not OpenAI-compatible, one that dies mid-run (and a
chat endpoint that records its calls)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import run_in_process
from tests.serve.conftest import serve_model  # noqa: F401 (fixture)
from tests.servers import (  # noqa: F401
    ROOT,
    ctxlab_serve,
    free_port,
    installed,
    llamacpp_serve,
    stop,
    wait_healthy,
)


@dataclass
class Script:
    """How the stand-in answers: `status` for every request, or an OpenAI stream that
    counts words as tokens (a word of `split` as more); after `die_after` completions the
    server closes. With `page`, a paged prefix cache reports cached tokens; with `tokenize`,
    POST /tokenize counts as the completions do."""

    status: int = 200
    models_body: str = '{"object": "list", "data": [{"id": "m", "object": "model"}]}'
    die_after: int | None = None
    served: int = 0
    paths: list[str] = field(default_factory=list)  # every POST, in order
    chat_prompt_tokens: int | None = None  # chat usage.prompt_tokens (None: words counted)
    version: str | None = None  # GET /version answers it (as vLLM does) where set
    cached_details: bool = True  # False: usage without prompt_tokens_details (vLLM's default)
    split: dict[str, int] = field(default_factory=dict)  # word -> its tokens (others: 1)
    tokenize: bool = False  # answer POST /tokenize as vLLM does ({"tokens": [...]})
    page: int | None = None  # a prefix cache of pages of this many tokens (no eviction)
    pages: set[tuple[str, ...]] = field(default_factory=set)  # cached pages, by their prefix
    tokenized: int = 0  # /tokenize requests answered

    def tokens(self, prompt: str) -> list[str]:
        """The prompt's tokens: one per word, `split[w]` pieces for a split word."""
        return [f"{w}#{k}" for w in prompt.split() for k in range(self.split.get(w, 1))]

    def cached(self, toks: list[str]) -> int:
        """Whole pages reused (never the last token), and this prompt's pages cached."""
        if self.page is None:
            return 0
        keys = [tuple(toks[: (i + 1) * self.page]) for i in range(len(toks) // self.page)]
        hit = 0
        while hit < len(keys) and keys[hit] in self.pages and (hit + 1) * self.page < len(toks):
            hit += 1
        self.pages.update(keys)
        return hit * self.page


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: Script
    server_ref: list[Any]

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: str, kind: str = "application/json") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        s = self.script
        if s.status != 200:
            self._send(s.status, json.dumps({"error": {"message": "scripted", "code": s.status}}))
        elif self.path == "/v1/models":
            self._send(200, s.models_body, "application/json")
        elif self.path == "/version" and s.version is not None:
            self._send(200, json.dumps({"version": s.version}))
        else:
            self._send(404, "<html>not found</html>", "text/html")

    def do_POST(self) -> None:
        s = self.script
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if s.status != 200:
            self._send(s.status, json.dumps({"error": {"message": "scripted", "code": s.status}}))
            return
        s.paths.append(self.path)
        if self.path == "/v1/chat/completions":
            words = sum(len(m["content"].split()) for m in body.get("messages", []))
            n = s.chat_prompt_tokens if s.chat_prompt_tokens is not None else words
            reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}],
                     "usage": {"prompt_tokens": n, "completion_tokens": 1,
                               "prompt_tokens_details": {"cached_tokens": n // 2}}}  # fmt: skip
            self._send(200, json.dumps(reply))
            return
        if self.path == "/tokenize" and s.tokenize:
            s.tokenized += 1
            toks = s.tokens(str(body.get("prompt", "")))
            self._send(200, json.dumps({"count": len(toks), "tokens": list(range(len(toks)))}))
            return
        if self.path != "/v1/completions":
            self._send(404, "<html>not found</html>", "text/html")
            return
        if s.die_after is not None and s.served >= s.die_after:
            self.close_connection = True
            threading.Thread(target=self.server_ref[0].shutdown, daemon=True).start()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        s.served += 1
        toks = s.tokens(str(body.get("prompt", "")))
        usage = {"prompt_tokens": len(toks), "completion_tokens": 1}
        if s.cached_details:
            usage["prompt_tokens_details"] = {"cached_tokens": s.cached(toks)}
        events = [
            {"choices": [{"index": 0, "text": " x", "finish_reason": "length"}]},
            {"choices": [], "usage": usage},
        ]
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._send(200, text, "text/event-stream")


@contextlib.contextmanager
def stand_in(script: Script) -> Iterator[str]:
    ref: list[Any] = []
    handler = type("H", (_Handler,), {"script": script, "server_ref": ref})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    ref.append(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def probe_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`ctxlab probe ARGS` through the installed script, in its own process."""
    return installed("probe", *args, timeout=timeout)


@pytest.fixture
def cli(monkeypatch, capsys):
    """`ctxlab ARGS` in this process through the CLI's own entry point: `cli("probe", ...)`."""
    return lambda *args: run_in_process(monkeypatch, capsys, *args)


@pytest.fixture
def keep_torch_threads() -> Iterator[None]:
    """Restore torch's thread count after an in-process workshop (its config sets it)."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def report(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
