"""What `--json` prints: strict JSON, so NaN and Infinity never reach a parser that refuses them.

A mean over nothing or a rate with no interval is NaN in Python, and `json.dumps` would print
the non-JSON token `NaN`; here such a value is `null` ("no value"), and numpy scalars are
their Python values. Every command prints its `--json` document through `dumps`.
"""

from __future__ import annotations

import json
import math


def _clean(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item) and getattr(value, "shape", None) == ():
        return _clean(item())
    return value


def dumps(doc: object, indent: int | None = None) -> str:
    """`doc` as strict JSON: non-finite floats become null; anything else unknown is str."""
    return json.dumps(_clean(doc), indent=indent, allow_nan=False, default=str)
