"""The events of an OpenAI stream (server-sent events): each `data:` line is one JSON
object, `data: [DONE]` ends it, and comments (`: keep-alive`), `event:` and `id:` lines are
skipped. A `data:` that is not JSON, or is JSON but not an object, is refused in one
sentence naming the server."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from ctxlab.peer.fields import BadAnswer, Json, Source, show

DONE = "[DONE]"


def event(src: Source, raw: str) -> Json | str | None:
    """One line: its event (a JSON object), DONE at the end of the stream, else None."""
    line = raw.strip()
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == DONE:
        return DONE
    try:
        doc = json.loads(data)
    except json.JSONDecodeError:
        raise BadAnswer(
            f"{src.name()} answered with something that is not OpenAI's stream format "
            "(server-sent JSON events)"
        ) from None
    if not isinstance(doc, dict):
        raise BadAnswer(f"{src.name()} sent a stream event data: {show(doc)}, not a JSON object")
    return doc


def events(src: Source, lines: Iterable[str]) -> Iterator[Json]:
    """The stream's events up to DONE (or the end of the body)."""
    for raw in lines:
        doc = event(src, raw)
        if doc == DONE:
            return
        if isinstance(doc, dict):
            yield doc
