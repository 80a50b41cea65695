"""The one loading path for JSON and TOML a user hands in: bounded depth, finite numbers.

Python's parsers recurse per nesting level, so `[[[[...]]]]` a few thousand deep is a
`RecursionError` (a traceback, or an HTTP 500), and whatever walks the result recursively
next (pydantic, a config merge) fails the same way at a shallower depth. Real configs,
traces and requests nest a handful of levels; `MAX_DEPTH` refuses anything deeper with one
sentence. JSON's `NaN`/`Infinity` and TOML's `nan`/`inf` are not numbers a config can mean,
so they are refused here too (one numeric rule for every config field).
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.inputs.text import read_text

MAX_DEPTH = 64


class _NotFinite(Exception):
    def __init__(self, token: str) -> None:
        self.token = token


def _json_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _NotFinite(token)
    return value


def _json_constant(token: str) -> float:
    raise _NotFinite(token)


def _toml_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _NotFinite(token)
    return value


def check_depth(value: object, origin: str, max_depth: int = MAX_DEPTH) -> object:
    """Refuse a document nested deeper than `max_depth` (walked without recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list | tuple):
            children = list(item)
        else:
            continue
        if depth > max_depth:
            raise _too_deep(origin, max_depth)
        stack.extend((child, depth + 1) for child in children)
    return value


def _too_deep(origin: str, max_depth: int) -> CtxlabError:
    return CtxlabError(f"{origin} nests deeper than {max_depth} levels; no real input does.")


def loads_json(text: str | bytes, origin: str, max_depth: int = MAX_DEPTH) -> object:
    """Parse JSON text; every mistake is one sentence that starts with `origin`."""
    try:
        value = json.loads(text, parse_float=_json_float, parse_constant=_json_constant)
    except RecursionError:
        raise _too_deep(origin, max_depth) from None
    except _NotFinite as exc:
        raise CtxlabError(f"{origin} holds {exc.token}, which is not a finite number.") from None
    except json.JSONDecodeError as exc:
        raise CtxlabError(
            f"{origin} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from None
    except UnicodeDecodeError:
        raise CtxlabError(f"{origin} is not UTF-8 text.") from None
    return check_depth(value, origin, max_depth)


def load_json(path: str | Path, what: str = "file", max_depth: int = MAX_DEPTH) -> object:
    """Read a JSON file through the one text reader and `loads_json`."""
    return loads_json(read_text(path, what), f"{what} {path}", max_depth)


def loads_toml(text: str, origin: str, max_depth: int = MAX_DEPTH) -> dict[str, object]:
    """Parse TOML text; every mistake is one sentence that starts with `origin`."""
    try:
        value = tomllib.loads(text, parse_float=_toml_float)
    except RecursionError:
        raise _too_deep(origin, max_depth) from None
    except _NotFinite as exc:
        raise CtxlabError(f"{origin} holds {exc.token}, which is not a finite number.") from None
    except tomllib.TOMLDecodeError as exc:
        raise CtxlabError(f"{origin} is not valid TOML ({exc}).") from None
    check_depth(value, origin, max_depth)
    return value


def load_toml(path: str | Path, what: str = "file", max_depth: int = MAX_DEPTH) -> dict:
    """Read a TOML file through the one text reader and `loads_toml`."""
    return loads_toml(read_text(path, what), f"{what} {path}", max_depth)
