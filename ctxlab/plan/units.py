"""Parsing and printing of the planner's quantities: bytes, token counts, FLOPs, seconds.

Byte sizes are exact integers. Binary units (KiB, MiB, GiB, TiB) are powers of 1024 and
decimal ones (KB, MB, GB, TB) powers of 1000, each labelled so, because a "128K cache" or a
"17.2 GB" figure is only comparable when the unit says which one it is.
"""

from __future__ import annotations

import math
import re

from ctxlab.errors import CtxlabError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

_BYTE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "tib": TIB,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}

# Token counts: "128K" is 131,072 tokens as model cards use it (binary), "1M" is 1,048,576.
_TOKEN_UNITS: dict[str, int] = {"": 1, "k": 1024, "m": 1024**2}
MAX_BYTES = 2**60  # 1 EiB: past every device and every host tier (1e400 is inf)

_NUMBER = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def whole_bytes(value: float) -> int:
    """Round a byte count up to an integer (a 4-bit cache packs half a byte per element)."""
    return math.ceil(value)


def parse_bytes(text: str | int, what: str = "byte size") -> int:
    """'80GiB' -> 85899345920, '17.2GB' -> 17200000000, '4096' -> 4096 (exact integers)."""
    if isinstance(text, int):
        return text
    match = _NUMBER.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _BYTE_UNITS:
        raise CtxlabError(
            f"cannot read {what} {text!r}; write a number with an optional unit "
            "B, KiB, MiB, GiB, TiB (binary) or KB, MB, GB, TB (decimal), e.g. 80GiB or 17.2GB"
        )
    value = float(match.group(1)) * _BYTE_UNITS[unit]
    if not math.isfinite(value) or value > MAX_BYTES:
        raise CtxlabError(
            f"{what} {text!r} is absurdly large; ctxlab accepts up to 1 EiB ({MAX_BYTES:,} bytes)"
        )
    return round(value)


def parse_tokens(text: str, what: str = "token count") -> int:
    """'131072' or '128K' -> 131072; K and M are binary as in '128K context'."""
    match = _NUMBER.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _TOKEN_UNITS:
        raise CtxlabError(
            f"cannot read {what} {text!r}; write a whole number, optionally with K (x1024) "
            "or M (x1048576), e.g. 4096 or 128K"
        )
    value = float(match.group(1)) * _TOKEN_UNITS[unit]
    if not math.isfinite(value):
        raise CtxlabError(f"{what} {text!r} is not a finite number of tokens")
    if value != int(value):
        raise CtxlabError(f"{what} {text!r} is not a whole number of tokens")
    return int(value)


def parse_token_list(text: str, what: str = "context lengths") -> list[int]:
    """'4096,131072' -> [4096, 131072]; every entry must be positive."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise CtxlabError(f"{what} is empty; give one or more lengths such as 4096,131072")
    values = [parse_tokens(p.strip(), what) for p in parts]
    for value in values:
        require_positive(value, what)
    return values


def require_positive(value: float, what: str) -> None:
    """One sentence for the commonest user mistake: zero or negative sizes and prices."""
    if not (value > 0) or math.isinf(value):
        raise CtxlabError(f"{what} must be a positive number, got {value}")


def require_non_negative(value: float, what: str) -> None:
    if not (value >= 0) or math.isinf(value):
        raise CtxlabError(f"{what} must be zero or positive, got {value}")


def fmt_bytes(n: float) -> str:
    """Binary, labelled: '16.0 GiB', '512.0 MiB', '131,072 B'."""
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n):,} B"


def fmt_gb(n: float) -> str:
    """Decimal, labelled: '17.2 GB' (or '536.9 MB' below a gigabyte)."""
    if abs(n) < 1e9:
        return f"{n / 1e6:,.1f} MB"
    return f"{n / 1e9:,.1f} GB"


def fmt_flops(n: float) -> str:
    for unit, size in (("EFLOP", 1e18), ("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} FLOP"


def fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:,.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:,.2f} ms"
    return f"{s * 1e6:,.1f} µs"


def fmt_tokens(n: int) -> str:
    return f"{n:,}"


_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def count_word(n: int) -> str:
    """Small counts as words ('one', 'two'), larger ones as digits, for plain sentences."""
    return _WORDS[n] if 0 <= n < len(_WORDS) else f"{n:,}"


def short_tokens(n: float) -> str:
    """Axis ticks in tokens as model cards write them: 512, 4K, 128K, 1M (binary K and M)."""
    for unit, size in (("M", 1024**2), ("K", 1024)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}" if n == int(n) else f"{n:.3g}"


def short_bytes(n: float) -> str:
    """Axis ticks in binary bytes: 512 MiB, 1 GiB, 1.5 TiB."""
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.3g} B"
