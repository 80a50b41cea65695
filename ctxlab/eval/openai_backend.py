"""Score any OpenAI-compatible server (vLLM, SGLang, ctxlab serve) on the same tasks.

The remote cache is not visible from here, so rows from this backend carry no resident KV
bytes and the report says so. Sizing uses the local default tokenizer, which is only an
approximation of the remote model's count; the row records the local count it used. Every
request has a total deadline (`--timeout`) and every answer is read through
`ctxlab.peer.fields`, so a broken server is one sentence, never a traceback or a hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from ctxlab.errors import CtxlabError
from ctxlab.eval.sample import TaskSample
from ctxlab.peer import fields
from ctxlab.peer.deadline import Deadline, request
from ctxlab.peer.key import bearer, check_key
from ctxlab.peer.url import base_url, public, redact


@dataclass(frozen=True)
class Generation:
    text: str
    resident_kv_bytes: int | None
    prompt_tokens: int | None = None


@dataclass
class OpenAIBackend:
    """`model` is the name to ask the server for; `None` asks `/v1/models` once and takes
    `prefer` when the server serves it, else the only model served (a server that serves
    several and not `prefer` is one sentence listing them)."""

    base_url: str
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = 600.0  # total seconds per request

    name: str = "openai"
    http: httpx.Client = field(init=False, repr=False)

    prefer: str | None = None

    def __post_init__(self) -> None:
        self.base_url = base_url(self.base_url, "--base-url")
        check_key(self.api_key)  # before any request: a bad key is one sentence, unshown
        self.http = httpx.Client()

    def served_model(self) -> str:
        """The model every request names (read from `/v1/models` once when not given)."""
        if self.model is None:
            src = fields.Source(self.base_url, "GET /v1/models")
            served = [name for name, _ in fields.model_cards(src, self._call("GET", "/v1/models"))]
            if self.prefer in served:
                self.model = self.prefer
            elif len(served) == 1:
                self.model = served[0]
            else:
                shown = redact(public(self.base_url))
                names = ", ".join(served) if served else "none"
                raise CtxlabError(
                    f"{shown} serves {len(served)} models ({names}), none named "
                    f"{self.prefer!r}: name the one to evaluate with --model"
                )
        return self.model

    def _post(self, path: str, body: dict[str, object]) -> object:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: dict[str, object] | None = None) -> object:
        shown = redact(public(self.base_url)) + path
        headers = {"Content-Type": "application/json", **bearer(self.api_key)}
        try:
            reply = request(
                self.http, method, self.base_url + path, Deadline(self.timeout_s),
                json=body, headers=headers,
            )  # fmt: skip
        except httpx.TimeoutException:
            raise CtxlabError(
                f"{shown} gave no complete answer within {self.timeout_s:g} s (--timeout)"
            ) from None
        except httpx.HTTPError as exc:
            raise CtxlabError(
                f"cannot reach the OpenAI-compatible server at {shown} "
                f"({type(exc).__name__}: {redact(str(exc))})"
            ) from None
        if reply.status_code in (401, 403):
            raise CtxlabError(
                f"{shown} refused the API key (HTTP {reply.status_code}); give the right one "
                "with --api-key or $OPENAI_API_KEY"
            )
        if reply.status_code != 200:
            detail = redact(reply.text[:200]).replace("\n", " ")
            raise CtxlabError(f"{shown} answered HTTP {reply.status_code}: {detail}")
        return fields.parse(fields.Source(self.base_url, f"{method} {path}"), reply.body)

    def generate(self, samples: list[TaskSample]) -> list[Generation]:
        out = []
        src = fields.Source(self.base_url, "POST /v1/chat/completions")
        for sample in samples:
            reply = self._post(
                "/v1/chat/completions",
                {
                    "model": self.served_model(),
                    "messages": [
                        {
                            "role": "user",
                            "content": f"{sample.instruction}\n\n{sample.answer_prefix}",
                        }
                    ],
                    "max_tokens": sample.max_new_tokens,
                    "temperature": 0.0,
                },
            )
            text = fields.message_text(src, reply)
            top = fields.obj(src, reply, "the answer") or {}
            counted = fields.usage(src, top.get("usage"))
            out.append(Generation(text, None, counted.prompt_tokens))
        return out

    def close(self) -> None:
        self.http.close()
