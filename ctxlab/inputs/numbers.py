"""The one numeric check: finite everywhere, positive where a number divides or counts.

Options, config fields and request fields call these, so `nan`, `inf` and a zero block size
get the same sentence in every command (and `--json` never prints `NaN` or `Infinity`).
Seeds are whole numbers in [0, 2**64): what numpy and torch both accept.
"""

from __future__ import annotations

import math

from ctxlab.errors import CtxlabError

SEED_MAX = 2**64 - 1


def check_finite(value: float, name: str) -> float:
    """`value` if it is a finite number; otherwise one sentence naming `name`."""
    if isinstance(value, float) and not math.isfinite(value):
        raise CtxlabError(f"{name} must be a finite number, got {value}.")
    return value


def check_positive(value: float, name: str) -> float:
    """`value` if it is finite and above 0 (it divides or counts something)."""
    check_finite(value, name)
    if value <= 0:
        raise CtxlabError(f"{name} must be positive, got {value}.")
    return value


def check_seed(value: int, name: str = "--seed") -> int:
    """A seed numpy and torch both take: a whole number in [0, 2**64 - 1]."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise CtxlabError(f"{name} must be a whole number from 0 to 2**64 - 1, got {value}.")
    return value
