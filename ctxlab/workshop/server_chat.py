"""The backend demonstrations 5 and 6 get through a server: its chat API, as a user's
memory or retrieval layer would call it (`OpenAIChatBackend`, `/v1/chat/completions`).

The server renders each chat with its own template and answers with its own model; the
workshop reads the reply text, `usage.prompt_tokens` / `completion_tokens` and the prompt
tokens its cache served (`usage.prompt_tokens_details.cached_tokens`, else llama.cpp's
`timings.cache_n`). Budgets are counted with the workshop's local tokenizer, which is exact
only if it is the served model's: `check_counts` sends one chat and compares the server's
count with the local one before the demonstrations rely on it.

As `WorkshopBackend` does on the local engine, a batch whose chats share a long prefix
sends its first chat alone and the rest after it (in parallel), so the others can find
the shared prefix in the server's cache; every call is logged for the demonstrations'
token and reuse columns. A server that stops answering after it had answered raises
`ServerGone`, so the run keeps what it measured before.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ctxlab.errors import CtxlabError
from ctxlab.memory.backend import Chat, Reply
from ctxlab.memory.openai_backend import OpenAIChatBackend
from ctxlab.probe.client import ServerGone
from ctxlab.workshop.memory_backend import Call, CallLog, _common_prefix

if TYPE_CHECKING:
    from ctxlab.model.tokenizer import Tokenizer
    from ctxlab.workshop.server_backend import ServerLLM


PARALLEL = 16
CHECK_CHAT = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is the capital of France? Answer in one word."},
]


class ServerChatBackend(OpenAIChatBackend):
    """`OpenAIChatBackend` over the workshop's server: local counts, logged calls, cached
    tokens read from each reply."""

    name = "openai (workshop server)"

    def __init__(
        self,
        server: ServerLLM,
        tokenizer: Tokenizer,
        context_window: int,
        min_shared_tokens: int,
    ) -> None:
        c = server.client
        super().__init__(
            c.base_url, c.model, c.api_key or "none", context_window, timeout_s=c.timeout
        )
        self._tokenizer = tokenizer
        self._tokenizer_path = "(the workshop's model.source)"
        self.count_method = "local tokenizer (the workshop's model.source)"
        self.tokenizer = tokenizer
        self.min_shared_tokens = min_shared_tokens
        self.log = CallLog()
        self.answered = c.answered  # the server answered before: silence now means it stopped
        self.label = server.label(code=True)

    def _post(self, path: str, body: dict[str, Any], quiet_404: bool = False) -> dict[str, Any]:
        try:
            out = super()._post(path, body, quiet_404)
        except CtxlabError as exc:
            gone = ("cannot reach", "HTTP 5", "no complete answer")
            said = str(exc).replace("(--timeout)", "(--server-timeout)")  # the workshop's name
            if self.answered and any(w in said for w in gone):
                raise ServerGone(said) from None
            if said == str(exc):
                raise
            raise CtxlabError(said) from None
        self.answered += 1
        return out

    def check_counts(self) -> str | None:
        """None when the server counts a chat's prompt tokens as the local tokenizer does;
        otherwise why demonstrations 5 and 6 cannot budget through it."""
        local = self.count_tokens(CHECK_CHAT)
        served = self.usage(self.chat(CHECK_CHAT, max_tokens=1)).prompt_tokens
        if served is None:
            return "the server's chat replies report no usage.prompt_tokens"
        if served != local:
            return (
                f"the server counts {served} prompt tokens for a test chat and the workshop's "
                f"model.source {local}: the served model's tokenizer or chat template differs, "
                "so context budgets cannot be counted exactly (set model.source to the served "
                "model)"
            )
        return None

    def _one(self, chat: Chat, max_tokens: int) -> tuple[Reply, int]:
        reply = self.chat(chat, max_tokens)
        counted = self.usage(reply)  # checked: types, and cached <= prompt
        text = reply["choices"][0]["message"].get("content") or ""
        out = Reply(str(text).strip(), counted.prompt_tokens or 0, counted.completion_tokens or 0)
        return out, counted.cached_tokens or 0

    def generate(self, chats: Sequence[Chat], max_tokens: int) -> list[Reply]:
        chats = [list(c) for c in chats]
        done: list[tuple[Reply, int]] = []
        rest = chats
        if len(chats) > 1 and self._shares_prefix(chats):
            done.append(self._one(chats[0], max_tokens))
            rest = chats[1:]
        if len(rest) == 1:
            done.append(self._one(rest[0], max_tokens))
        elif rest:
            with ThreadPoolExecutor(min(PARALLEL, len(rest))) as pool:
                done += list(pool.map(lambda c: self._one(c, max_tokens), rest))
        replies = [r for r, _ in done]
        self.log.calls.append(
            Call(
                chats,
                max_tokens,
                sum(r.prompt_tokens for r in replies),
                sum(r.output_tokens for r in replies),
                sum(c for _, c in done),
            )
        )
        return replies

    def _shares_prefix(self, chats: list[list[dict[str, str]]]) -> bool:
        ids = [self._tokenizer.apply_chat(c, add_generation_prompt=True) for c in chats]
        return _common_prefix(ids) >= self.min_shared_tokens

    def close(self) -> None:
        self._http.close()
