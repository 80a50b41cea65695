"""The one loading path for JSON and TOML a user hands in: bounded depth, finite numbers.

Python's parsers recurse per nesting level, so `[[[[...]]]]` a few thousand deep is a
`RecursionError` (a traceback, or an HTTP 500), and whatever walks the result recursively
next (pydantic, a config merge) fails the same way at a shallower depth. Real configs,
traces and requests nest a handful of levels; `MAX_DEPTH` refuses anything deeper with one
sentence. JSON's `NaN`/`Infinity` and TOML's `nan`/`inf` are not numbers a config can mean,
so they are refused here too (one numeric rule for every config field), and so is a string
with a lone surrogate (JSON's `"\ud800"`), which is not text and fails later in SQLite,
the tokenizer or an HTTP answer.
"""

from __future__ import annotations

import json
import math
import sys
import tomllib
from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.inputs.text import check_text, read_text

MAX_DEPTH = 64


class _NotFinite(Exception):
    def __init__(self, token: str) -> None:
        self.token = token


def _finite_float(token: str) -> float:
    """A float token of JSON or TOML, refused when it overflows (1e999) or is inf/nan."""
    value = float(token)
    if not math.isfinite(value):
        raise _NotFinite(token)
    return value


def _json_constant(token: str) -> float:
    raise _NotFinite(token)  # NaN, Infinity, -Infinity


def check_tree(value: object, origin: str, max_depth: int = MAX_DEPTH) -> object:
    """Refuse a document nested deeper than `max_depth` or holding a string that is not text
    (walked without recursion); the message names the first bad string's place."""
    _check_string(value, origin, None)
    # Each entry: (container, depth, place); place is (parent place, key), None at the top.
    stack: list[tuple[object, int, tuple | None]] = [(value, 1, None)]
    while stack:
        item, depth, place = stack.pop()
        if isinstance(item, dict):
            for key in item:
                if isinstance(key, str) and not key.isascii() and not _is_text(key):
                    check_text(key, f"a key of {_at(origin, place)}")
            pairs = item.items()
        elif isinstance(item, list | tuple):
            pairs = enumerate(item)
        else:
            continue
        if depth > max_depth:
            raise _too_deep(origin, max_depth)
        for key, child in pairs:
            if isinstance(child, str):
                if not child.isascii() and not _is_text(child):
                    check_text(child, _at(origin, (place, key)))
            elif isinstance(child, dict | list | tuple):
                stack.append((child, depth + 1, (place, key)))
    return value


def _check_string(value: object, origin: str, place: tuple | None) -> None:
    if isinstance(value, str) and not value.isascii() and not _is_text(value):
        check_text(value, _at(origin, place))


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _at(origin: str, place: tuple | None) -> str:
    """`origin at messages[0].content` for the place of a value (None: the top)."""
    keys: list[object] = []
    while place is not None:
        place, key = place
        keys.append(key)
    where = ""
    for key in reversed(keys):
        where += f"[{key}]" if isinstance(key, int) else (f".{key}" if where else str(key))
    return f"{origin} at {where}" if where else origin


def _too_many_digits(origin: str, exc: ValueError) -> CtxlabError:
    """A number with thousands of digits: Python refuses to convert it (a DoS guard), and
    no count, size or price a user means has that many."""
    if "digits" not in str(exc):
        raise exc
    return CtxlabError(
        f"{origin} holds a number of more than {sys.get_int_max_str_digits():,} digits, which "
        "no real input has."
    )


def _too_deep(origin: str, max_depth: int) -> CtxlabError:
    return CtxlabError(f"{origin} nests deeper than {max_depth} levels; no real input does.")


def loads_json(text: str | bytes, origin: str, max_depth: int = MAX_DEPTH) -> object:
    """Parse JSON text; every mistake is one sentence that starts with `origin`."""
    try:
        value = json.loads(text, parse_float=_finite_float, parse_constant=_json_constant)
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
    except ValueError as exc:  # Python's limit on integer digits (4,300 by default)
        raise _too_many_digits(origin, exc) from None
    return check_tree(value, origin, max_depth)


def load_json(path: str | Path, what: str = "file", max_depth: int = MAX_DEPTH) -> object:
    """Read a JSON file through the one text reader and `loads_json`."""
    return loads_json(read_text(path, what), f"{what} {path}", max_depth)


def loads_toml(text: str, origin: str, max_depth: int = MAX_DEPTH) -> dict[str, object]:
    """Parse TOML text; every mistake is one sentence that starts with `origin`."""
    try:
        value = tomllib.loads(text, parse_float=_finite_float)
    except RecursionError:
        raise _too_deep(origin, max_depth) from None
    except _NotFinite as exc:
        raise CtxlabError(f"{origin} holds {exc.token}, which is not a finite number.") from None
    except tomllib.TOMLDecodeError as exc:
        raise CtxlabError(f"{origin} is not valid TOML ({exc}).") from None
    except ValueError as exc:
        raise _too_many_digits(origin, exc) from None
    check_tree(value, origin, max_depth)
    return value


def load_toml(path: str | Path, what: str = "file", max_depth: int = MAX_DEPTH) -> dict:
    """Read a TOML file through the one text reader and `loads_toml`."""
    return loads_toml(read_text(path, what), f"{what} {path}", max_depth)
