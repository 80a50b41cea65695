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

        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        self.model = model
        self._model_resolved = model != "default"
        self._window = context_window
        self._tokenizer_path = tokenizer
        self._tokenizer: Any = None
        self._http = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"})
        self.count_method: str | None = "local tokenizer" if tokenizer else None
        self._probe_cache: dict[str, int] = {}

    # -- HTTP ---------------------------------------------------------------------------------
    def _post(self, path: str, body: dict[str, Any], quiet_404: bool = False) -> dict[str, Any]:
        import httpx

        url = self.base_url + path
        try:
            response = self._http.post(url, json=body)
        except httpx.HTTPError as exc:
            raise CtxlabError(
                f"cannot reach the OpenAI-compatible server at {url} ({exc})."
            ) from None
        if quiet_404 and response.status_code in (400, 404, 405, 501):
            return {}
        if response.status_code >= 400:
            detail = response.text[:200].replace("\n", " ")
            raise CtxlabError(f"{url} answered HTTP {response.status_code}: {detail}")
        try:
            return response.json()
        except json.JSONDecodeError:
            raise CtxlabError(f"{url} did not answer with JSON.") from None

    def served_model(self) -> str:
        """The model name sent: the one given, or for "default" the server's only model
        (`GET /v1/models`, asked once), so `--base-url` alone reaches a server like
        `ctxlab serve` that refuses names it does not serve; "default" stays when the
        server lists none or several, or cannot be asked."""
        if self._model_resolved:
            return self.model
        self._model_resolved = True
        import httpx

        try:
            response = self._http.get(self.base_url + "/v1/models")
            ids = [m.get("id") for m in response.json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError, TypeError):
            return self.model
        if response.status_code == 200 and len(ids) == 1 and isinstance(ids[0], str):
            self.model = ids[0]
        return self.model

    def chat(
        self, chat: Chat, max_tokens: int, tools: Sequence[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """One chat completion; returns the whole reply object."""
        body: dict[str, Any] = {
            "model": self.served_model(),
            "messages": list(chat),
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        if tools:
            body["tools"] = list(tools)
        reply = self._post("/v1/chat/completions", body)
        try:
            reply["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise CtxlabError(f"{self.base_url} answered without choices[0].message.") from None
        return reply

    # -- Backend ------------------------------------------------------------------------------
    @property
    def context_window(self) -> int:
        if self._window is None:
            info = self._post(
                "/tokenize", {"model": self.served_model(), "prompt": "x"}, quiet_404=True
            )
            window = info.get("max_model_len")
            if not window:
                raise CtxlabError(
                    f"{self.base_url} does not report its context window; give it with --window."
                )
            self._window = int(window)
        return self._window

    def count_tokens(self, chat: Chat) -> int:
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
                return int(info["count"])
            self.count_method = "server usage (max_tokens=1)"
        key = hashlib.sha256(json.dumps(list(chat), sort_keys=True).encode()).hexdigest()
        if key not in self._probe_cache:
            usage = self.chat(chat, max_tokens=1).get("usage") or {}
            if "prompt_tokens" not in usage:
                raise CtxlabError(
                    f"{self.base_url} has no /tokenize and reports no usage; give the served "
                    "model's tokenizer with --tokenizer for exact counts."
                )
            self._probe_cache[key] = int(usage["prompt_tokens"])
        return self._probe_cache[key]

    def spans(self, text: str) -> list[tuple[int, int]]:
        if self._tokenizer_path is None:
            raise CtxlabError(
                "chunking in tokens needs the model's tokenizer; give it with --tokenizer."
            )
        enc = self._local().hf(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    def generate(self, chats: Sequence[Chat], max_tokens: int) -> list[Reply]:
        out = []
        for chat in chats:
            reply = self.chat(chat, max_tokens)
            text = reply["choices"][0]["message"].get("content") or ""
            usage = reply.get("usage") or {}
            out.append(
                Reply(
                    str(text).strip(),
                    int(usage.get("prompt_tokens", 0)),
                    int(usage.get("completion_tokens", 0)),
                )
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
