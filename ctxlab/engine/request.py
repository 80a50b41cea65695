"""A request's shapes: the prompts the engine takes and what it gives back.

Shared by the step loop (`LLMEngine`), the batch API (`LLM`) and the server, so none of them
imports another to name a result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxlab.engine.metrics import RequestMetrics
from ctxlab.engine.sequence import RequestError
from ctxlab.errors import CtxlabError

Prompt = str | list[int] | list[dict[str, str]]


@dataclass
class RequestOutput:
    """One finished request.

    `token_ids` are every generated id, the end-of-sequence id included when generation
    stopped on it (`finish_reason == "stop"`); `text` is those ids decoded with special
    tokens skipped, so the end-of-sequence token never shows in it.
    """

    request_id: int
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    metrics: RequestMetrics
    prompt_logprobs: list[float | None] | None = None  # with SamplingParams(prompt_logprobs)
    error: RequestError | None = None  # set when finish_reason is "error"


@dataclass
class TokenEvent:
    """One produced token of one request (what the streaming form yields).

    A request that fails inside a step gets one last event with `token_id` -1 and an output
    whose `finish_reason` is "error".
    """

    request_id: int
    token_id: int
    text_delta: str
    finished: bool
    output: RequestOutput | None = None  # set on the request's last event


def is_chat(p: Any) -> bool:
    return isinstance(p, list) and bool(p) and all(isinstance(m, dict) for m in p)


def is_ids(p: Any) -> bool:
    return isinstance(p, list) and all(isinstance(t, int) for t in p) and not is_chat(p)


def as_prompt_list(prompts: Any) -> list[Prompt]:
    """One prompt (text, chat or token ids) or a list of them -> a list of prompts."""
    if isinstance(prompts, str) or is_chat(prompts):
        return [prompts]
    if isinstance(prompts, list) and prompts and is_ids(prompts):
        return [prompts]
    if isinstance(prompts, list | tuple):
        return list(prompts)
    raise CtxlabError("prompts must be a string, a chat (list of messages), token ids, or a list.")


class RequestFailedError(CtxlabError):
    """Raised by `LLM.generate` when a request failed; `outputs` holds every request's
    output (the failed ones with finish_reason "error"), so the others are not lost."""

    def __init__(self, message: str, outputs: list[RequestOutput]):
        super().__init__(message)
        self.outputs = outputs
