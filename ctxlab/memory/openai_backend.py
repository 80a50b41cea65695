"""Any OpenAI-compatible server as a memory backend (vLLM, SGLang, llama.cpp, ctxlab serve).

Exact counting is the hard part of a remote model: its tokenizer and chat template live on
the server. In order of preference the count comes from (1) a local copy of the served
model's tokenizer (`tokenizer=` a .gguf file or Hugging Face folder), (2) the server's own
`/tokenize` endpoint with chat messages (vLLM's form), or (3) the server's usage report for
the same chat sent with `max_tokens=1` (exact, at the price of one request; cached).
`count_method` says which one is in use.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from ctxlab.errors import CtxlabError
from ctxlab.memory.backend import Chat, Reply


class OpenAIChatBackend:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str = "default",
        api_key: str = "none",
        context_window: int | None = None,
        tokenizer: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        import httpx

        from ctxlab.peer.key import bearer
        from ctxlab.peer.url import base_url as root_url
        from ctxlab.peer.url import public, redact

        self.base_url = root_url(base_url, "--base-url")  # a trailing /v1 is dropped
        self.shown = redact(public(self.base_url))  # the server as printed
        self.model = model
        self._model_resolved = model != "default"
        self._window = context_window
        self._tokenizer_path = tokenizer
        self._tokenizer: Any = None
        self.timeout_s = timeout_s  # total seconds per request
        self._http = httpx.Client(headers=bearer(api_key))  # checked: never echoed
        self.count_method: str | None = "local tokenizer" if tokenizer else None
        self._probe_cache: dict[str, int] = {}

    # -- HTTP ---------------------------------------------------------------------------------
    def _source(self, method: str, path: str) -> Any:
        from ctxlab.peer.fields import Source

        return Source(self.base_url, f"{method} {path}")

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request within the total deadline; its status and body (a `peer.Reply`)."""
        import httpx

        from ctxlab.peer.deadline import Deadline, request
        from ctxlab.peer.url import redact

        url = self.base_url + path
        shown = self.shown + path
        try:
            return request(self._http, method, url, Deadline(self.timeout_s), json=body)
        except httpx.TimeoutException:
            raise CtxlabError(
                f"{shown} gave no complete answer within {self.timeout_s:g} s (--timeout)."
            ) from None
        except httpx.HTTPError as exc:
            raise CtxlabError(
                f"cannot reach the OpenAI-compatible server at {shown} "
                f"({type(exc).__name__}: {redact(str(exc))})."
            ) from None

    def _post(self, path: str, body: dict[str, Any], quiet_404: bool = False) -> dict[str, Any]:
        from ctxlab.peer import fields
        from ctxlab.peer.url import redact

        reply = self._request("POST", path, body)
        if quiet_404 and reply.status_code in (400, 404, 405, 501):
            return {}
        if reply.status_code >= 400:
            detail = redact(reply.text[:200]).replace("\n", " ")
            raise CtxlabError(f"{self.shown + path} answered HTTP {reply.status_code}: {detail}")
        src = self._source("POST", path)
        doc = fields.obj(src, fields.parse(src, reply.body), "the answer")
        assert doc is not None
        return doc

    def served_model(self) -> str:
        """The model name sent: the one given, or for "default" the server's only model
        (`GET /v1/models`, asked once), so `--base-url` alone reaches a server like
        `ctxlab serve` that refuses names it does not serve; "default" stays when the
        server lists none or several, or cannot be asked."""
        if self._model_resolved:
            return self.model
        self._model_resolved = True
        from ctxlab.peer import fields

        reply = self._request("GET", "/v1/models")
        if reply.status_code != 200:
            return self.model
        src = self._source("GET", "/v1/models")
        try:
            doc = fields.parse(src, reply.body)
        except CtxlabError:
            return self.model  # not a model list: keep the name given
        ids = [i for i, _ in fields.model_cards(src, doc)]
        if len(ids) == 1:
            self.model = ids[0]
        return self.model

    def chat(
        self, chat: Chat, max_tokens: int, tools: Sequence[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """One chat completion; returns the whole reply object (its message checked)."""
        from ctxlab.peer import fields

        body: dict[str, Any] = {
            "model": self.served_model(),
            "messages": list(chat),
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        if tools:
            body["tools"] = list(tools)
        reply = self._post("/v1/chat/completions", body)
        fields.message_text(self._source("POST", "/v1/chat/completions"), reply)
        return reply

    def usage(self, reply: dict[str, Any]) -> Any:
        """The reply's `usage` (and `timings`), checked (`peer.fields.Usage`)."""
        from ctxlab.peer import fields

        src = self._source("POST", "/v1/chat/completions")
        return fields.usage(src, reply.get("usage"), reply.get("timings"))

    # -- Backend ------------------------------------------------------------------------------
    @property
    def context_window(self) -> int:
        if self._window is None:
            from ctxlab.peer import fields

            info = self._post(
                "/tokenize", {"model": self.served_model(), "prompt": "x"}, quiet_404=True
            )
            src = self._source("POST", "/tokenize")
            window = fields.count(src, info.get("max_model_len"), "max_model_len")
            if not window:
                raise CtxlabError(
                    f"{self.shown} does not report its context window; give it with --window."
                )
            self._window = window
        return self._window

    def count_tokens(self, chat: Chat) -> int:
        from ctxlab.peer import fields

        if self._tokenizer_path is not None:
            return len(self._local().apply_chat(list(chat), add_generation_prompt=True))
        if self.count_method in (None, "server /tokenize"):
            info = self._post(
                "/tokenize",
                {
                    "model": self.served_model(),
                    "messages": list(chat),
                    "add_generation_prompt": True,
                },
                quiet_404=True,
            )
            if "count" in info:
                self.count_method = "server /tokenize"
                src = self._source("POST", "/tokenize")
                return int(fields.count(src, info["count"], "count", required=True) or 0)
            self.count_method = "server usage (max_tokens=1)"
        key = hashlib.sha256(json.dumps(list(chat), sort_keys=True).encode()).hexdigest()
        if key not in self._probe_cache:
            prompt = self.usage(self.chat(chat, max_tokens=1)).prompt_tokens
            if prompt is None:
                raise CtxlabError(
                    f"{self.shown} has no /tokenize and reports no usage; give the served "
                    "model's tokenizer with --tokenizer for exact counts."
                )
            self._probe_cache[key] = prompt
        return self._probe_cache[key]

    def spans(self, text: str) -> list[tuple[int, int]]:
        if self._tokenizer_path is None:
            raise CtxlabError(
                "chunking in tokens needs the model's tokenizer; give it with --tokenizer."
            )
        enc = self._local().hf(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    def generate(self, chats: Sequence[Chat], max_tokens: int) -> list[Reply]:
        from ctxlab.peer import fields

        out = []
        src = self._source("POST", "/v1/chat/completions")
        for chat in chats:
            reply = self.chat(chat, max_tokens)
            counted = self.usage(reply)
            text = fields.message_text(src, reply)
            out.append(
                Reply(text.strip(), counted.prompt_tokens or 0, counted.completion_tokens or 0)
            )
        return out

    def measure_prefill(self, chat: Chat) -> float | None:
        """None: a remote reply time mixes prefill with queueing and the network."""
        return None

    def _local(self) -> Any:
        if self._tokenizer is None:
            from ctxlab.model.registry import resolve_model_path
            from ctxlab.model.tokenizer import load_tokenizer

            assert self._tokenizer_path is not None
            self._tokenizer = load_tokenizer(str(resolve_model_path(self._tokenizer_path)))
        return self._tokenizer
