"""Typed accessors over a server's JSON answer: each returns the type the caller needs or
raises one sentence naming the server, the endpoint, the field and what came instead.

A server is whatever answers on the port: `usage` may be a list, `cached_tokens` a string,
`choices` an object, a model id null. Values that have the right type but cannot be true
(cached tokens above the prompt, negative counts, 1e30 tokens, NaN) are refused with a
finding, never reported as measured.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ctxlab.errors import CtxlabError
from ctxlab.peer.url import public, redact

MAX_COUNT = 10**12  # more tokens than any server holds: a count above it is not a count

Json = dict[str, object]


class BadAnswer(CtxlabError):
    """A server's answer has a shape or a value ctxlab cannot use."""


@dataclass(frozen=True)
class Source:
    """Where an answer came from, for the sentence that refuses it."""

    server: str  # the URL as given (shown without credentials)
    endpoint: str  # e.g. "POST /v1/completions"

    def name(self) -> str:
        return f"{redact(public(self.server))} ({self.endpoint})"

    def bad(self, field: str, value: object, want: str) -> BadAnswer:
        return BadAnswer(f"{self.name()} answered with {field} = {show(value)}, not {want}")

    def finding(self, sentence: str) -> BadAnswer:
        return BadAnswer(f"{self.name()}: the server {sentence}")


def show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    kind = {str: "a string", list: "a list", dict: "an object"}.get(type(value))
    text = json.dumps(value, default=str, allow_nan=True)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{redact(text)} ({kind})" if kind else redact(text)


def obj(src: Source, value: object, field: str, required: bool = True) -> Json | None:
    """A JSON object; None when absent (null) and not required."""
    if value is None and not required:
        return None
    if not isinstance(value, dict):
        raise src.bad(field, value, "a JSON object")
    return value


def items(src: Source, value: object, field: str, required: bool = True) -> list[object] | None:
    """A JSON list; None when absent (null) and not required."""
    if value is None and not required:
        return None
    if not isinstance(value, list):
        raise src.bad(field, value, "a list")
    return value


def text(src: Source, value: object, field: str, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise src.bad(field, value, "a string")
    return value


def count(src: Source, value: object, field: str, required: bool = False) -> int | None:
    """A whole number of tokens (or slots, blocks): 0 to MAX_COUNT; 12.0 is 12."""
    if value is None and not required:
        return None
    whole = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        whole, value = True, int(value)
    if not whole or not 0 <= value <= MAX_COUNT:  # type: ignore[operator]
        raise src.bad(field, value, f"a whole number from 0 to {MAX_COUNT:.0e}")
    return int(value)  # type: ignore[call-overload]


def number(src: Source, value: object, field: str, required: bool = False) -> float | None:
    """A finite number (a gauge, a ratio)."""
    if value is None and not required:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value):  # type: ignore[arg-type]
        raise src.bad(field, value, "a finite number")
    return float(value)  # type: ignore[arg-type]


def parse(src: Source, body: bytes | str) -> object:
    """A whole answer's JSON, or one sentence when it is not JSON."""
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadAnswer(f"{src.name()} did not answer with JSON") from None


def error_message(doc: Json) -> str | None:
    """The `error.message` of an OpenAI error object (or the error as text), else None."""
    if "error" not in doc:
        return None
    err = doc["error"]
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return redact(err["message"][:300])
    return redact(str(err)[:300])


@dataclass(frozen=True)
class Usage:
    """What a server says it counted for one request, checked to be possible."""

    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    cached_source: str  # "usage.prompt_tokens_details.cached_tokens", "timings.cache_n", ""


def usage(src: Source, usage_doc: object, timings_doc: object = None) -> Usage:
    """`usage` (and llama.cpp's `timings.cache_n`, read when no cached_tokens is given)."""
    u = obj(src, usage_doc, "usage", required=False) or {}
    t = obj(src, timings_doc, "timings", required=False) or {}
    prompt = count(src, u.get("prompt_tokens"), "usage.prompt_tokens")
    completion = count(src, u.get("completion_tokens"), "usage.completion_tokens")
    details = obj(src, u.get("prompt_tokens_details"), "usage.prompt_tokens_details", False)
    cached, source = None, ""
    if details is not None and details.get("cached_tokens") is not None:
        cached = count(src, details["cached_tokens"], "usage.prompt_tokens_details.cached_tokens")
        source = "usage.prompt_tokens_details.cached_tokens"
    elif t.get("cache_n") is not None:
        cached, source = count(src, t["cache_n"], "timings.cache_n"), "timings.cache_n"
    if cached is not None and prompt is not None and cached > prompt:
        raise src.finding(
            f"reports more cached tokens than prompt tokens ({cached:,} of {prompt:,} in "
            f"{source}), which cannot be"
        )
    return Usage(prompt, completion, cached, source)


def choice_text(src: Source, event: Json, chat: bool) -> str | None:
    """The text of `choices[0]` of one streamed event (`delta.content` for a chat)."""
    choices = items(src, event.get("choices"), "choices", required=False) or []
    if not choices:
        return None
    first = obj(src, choices[0], "choices[0]")
    assert first is not None
    if chat:
        delta = obj(src, first.get("delta"), "choices[0].delta", required=False) or {}
        return text(src, delta.get("content"), "choices[0].delta.content")
    return text(src, first.get("text"), "choices[0].text")


def message(src: Source, doc: object) -> Json:
    """`choices[0].message` of a whole chat answer."""
    top = obj(src, doc, "the answer")
    assert top is not None
    choices = items(src, top.get("choices"), "choices")
    if not choices:
        raise src.bad("choices", choices, "a list with one choice")
    first = obj(src, choices[0], "choices[0]")
    assert first is not None
    msg = obj(src, first.get("message"), "choices[0].message")
    assert msg is not None
    return msg


def message_text(src: Source, doc: object) -> str:
    """`choices[0].message.content` of a whole chat answer ("" when null)."""
    return text(src, message(src, doc).get("content"), "choices[0].message.content") or ""


def model_cards(src: Source, doc: object) -> list[tuple[str, Json]]:
    """`GET /v1/models`: (id, card) per served model; an id must be a non-empty string."""
    top = obj(src, doc, "the answer")
    assert top is not None
    cards = items(src, top.get("data"), "data")
    assert cards is not None
    out = []
    for k, card in enumerate(cards):
        c = obj(src, card, f"data[{k}]")
        assert c is not None
        model_id = text(src, c.get("id"), f"data[{k}].id", required=True)
        if not model_id:
            raise src.bad(f"data[{k}].id", model_id, "a model name")
        out.append((str(model_id), c))
    return out
