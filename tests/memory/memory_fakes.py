"""A deterministic stand-in for a model, so memory and retrieval logic run without one.

`WordBackend` counts a chat as its whitespace words plus a fixed cost per message and for
the generation prompt (the shape of a real chat template's count), splits text into
whitespace tokens for chunking, and answers each chat with a scripted function.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ctxlab.memory.backend import Reply

PER_MESSAGE = 4
GENERATION_PROMPT = 3


class WordBackend:
    name = "words"

    def __init__(self, window: int = 256, answer: Callable[[list[dict]], str] | None = None):
        self._window = window
        self.answer = answer or (lambda chat: "ok")
        self.calls: list[list[dict]] = []

    @property
    def context_window(self) -> int:
        return self._window

    def count_tokens(self, chat: Sequence[dict]) -> int:
        return GENERATION_PROMPT + sum(PER_MESSAGE + len(m["content"].split()) for m in chat)

    def spans(self, text: str) -> list[tuple[int, int]]:
        return [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]

    def generate(self, chats: Sequence[Sequence[dict]], max_tokens: int) -> list[Reply]:
        out = []
        for chat in chats:
            self.calls.append(list(chat))
            text = " ".join(self.answer(list(chat)).split()[:max_tokens])
            out.append(Reply(text, self.count_tokens(chat), len(text.split())))
        return out

    def measure_prefill(self, chat: Sequence[dict]) -> float | None:
        return None


@pytest.fixture(scope="session")
def real_backend(loaded):
    """The default model behind the Backend protocol, sharing the session's loaded weights
    (counting needs only its tokenizer; generating builds an engine over the same weights)."""
    from ctxlab.memory.engine_backend import EngineBackend

    return EngineBackend(loaded, context_window=8192)


class FakeOpenAI(BaseHTTPRequestHandler):
    """A tiny OpenAI-compatible server over real HTTP: with tools it makes one tool call,
    then answers; /tokenize counts words (and can be switched off)."""

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):
        self.server.gets.append(self.path)
        if self.path != "/v1/models" or self.server.models is None:
            self.send_error(404)
            return
        return self._json({"object": "list", "data": [{"id": m} for m in self.server.models]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body))
        if self.path == "/tokenize":
            if not self.server.tokenize:
                self.send_error(404)
                return
            words = sum(len(m["content"].split()) + 4 for m in body.get("messages", []))
            return self._json({"count": words + 3, "max_model_len": 2048})
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        messages = body["messages"]
        usage = {"prompt_tokens": 11 * len(messages), "completion_tokens": 1}
        if body.get("tools") and not any(m["role"] == "tool" for m in messages):
            call = {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "core_memory_append",
                    "arguments": json.dumps({"label": "human", "content": "Likes tea."}),
                },
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            message = {"role": "assistant", "content": "Done. [remembered]"}
        return self._json({"choices": [{"message": message}], "usage": usage})

    def _json(self, doc):
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    httpd.requests, httpd.tokenize = [], True
    httpd.gets, httpd.models = [], None  # models: the ids GET /v1/models lists (None: 404)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
