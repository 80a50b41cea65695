"""Reading request traces: Mooncake JSONL and CSV files, or a `synthetic:` generator spec.

A trace (`ctxlab.sim.requests`) is a list of `Request`s in arrival order with prefix
identity in `hash_ids`. Readers check every line before anything is simulated, and report
bad lines by number.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from ctxlab.arch.limits import MAX_TOKENS
from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_input_file, loads_json, read_text, shown
from ctxlab.sim.requests import DEFAULT_BLOCK_TOKENS, Request, Trace, check_block_tokens
from ctxlab.sim.synthetic import generate_from_spec

__all__ = [
    "DEFAULT_BLOCK_TOKENS",
    "Request",
    "Trace",
    "check_block_tokens",
    "load_trace",
    "read_csv",
    "read_mooncake",
]

_MAX_REPORTED = 5


def _positive_int(value: object) -> bool:
    """A whole number of tokens from 1 up to MAX_TOKENS (more is absurd, not a request)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_TOKENS


def _bad_lines_error(path: Path, bad: list[tuple[int, str]], total_bad: int) -> CtxlabError:
    lines = "; ".join(f"line {n}: {why}" for n, why in bad[:_MAX_REPORTED])
    more = f" (and {total_bad - _MAX_REPORTED} more)" if total_bad > _MAX_REPORTED else ""
    return CtxlabError(f"trace {shown(path)} has {total_bad} malformed line(s), {lines}{more}")


def _check_mooncake(rec: object, block_tokens: int) -> str | None:
    """Why this record is not a usable Mooncake request, or None when it is."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in rec:
            return f"missing {key!r}"
    ts = rec["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        return f"timestamp must be a non-negative number of ms, got {ts!r}"
    if not _positive_int(rec["input_length"]):
        return (
            f"input_length must be an integer from 1 to {MAX_TOKENS:,}, got {rec['input_length']!r}"
        )
    if not _positive_int(rec["output_length"]):
        return (
            f"output_length must be an integer from 1 to {MAX_TOKENS:,}, "
            f"got {rec['output_length']!r}"
        )
    ids = rec["hash_ids"]
    if not isinstance(ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in ids
    ):
        return "hash_ids must be a list of integers"
    want = -(-rec["input_length"] // block_tokens)
    if len(ids) != want:
        return (
            f"{len(ids)} hash_ids for {rec['input_length']} input tokens, expected {want} "
            f"at {block_tokens} tokens per block"
        )
    return None


def read_mooncake(path: str | Path, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> Trace:
    """Read a Mooncake JSONL trace (timestamp in ms); every line is checked first."""
    path = Path(path)
    check_block_tokens(block_tokens)
    requests: list[Request] = []
    bad: list[tuple[int, str]] = []
    total_bad = 0
    for number, text in enumerate(read_text(path, "trace").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            rec = loads_json(text, "@")
        except CtxlabError as exc:  # why, without the origin: "not valid JSON (...)"
            why: str | None = str(exc).removeprefix("@ ").removeprefix("is ").rstrip(".")
        else:
            why = _check_mooncake(rec, block_tokens)
        if why is not None:
            total_bad += 1
            if len(bad) < _MAX_REPORTED:
                bad.append((number, why))
            continue
        requests.append(
            Request(
                index=len(requests),
                arrival=rec["timestamp"] / 1000.0,
                input_len=rec["input_length"],
                output_len=rec["output_length"],
                hash_ids=tuple(rec["hash_ids"]),
                line=number,
            )
        )
    if total_bad:
        raise _bad_lines_error(path, bad, total_bad)
    return _finish(shown(path.name), requests, block_tokens)


def read_csv(path: str | Path, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> Trace:
    """Read a CSV trace (arrived_at in seconds, num_prefill_tokens, num_decode_tokens).

    CSV traces carry no prefix identity, so every request gets its own block ids: nothing is
    shared, which is the honest reading of a trace that does not say.
    """
    path = Path(path)
    need = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
    check_block_tokens(block_tokens)
    handle = io.StringIO(read_text(path, "trace"), newline="")
    requests: list[Request] = []
    bad: list[tuple[int, str]] = []
    total_bad = 0
    next_id = 0
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise CtxlabError(f"trace {shown(path)} line 1: missing column(s) {', '.join(missing)}")
        for row in reader:
            number = reader.line_num
            try:
                arrived = float(row["arrived_at"])
                n_in = int(row["num_prefill_tokens"])
                n_out = int(row["num_decode_tokens"])
            except (TypeError, ValueError):
                why: str | None = (
                    "arrived_at, num_prefill_tokens or num_decode_tokens is not a number"
                )
            else:
                why = None
                if not math.isfinite(arrived) or arrived < 0:
                    why = f"arrived_at must be a non-negative number of seconds, got {arrived}"
                elif not (_positive_int(n_in) and _positive_int(n_out)):
                    why = (
                        "num_prefill_tokens and num_decode_tokens must be whole numbers from 1 "
                        f"to {MAX_TOKENS:,}"
                    )
            if why is not None:
                total_bad += 1
                if len(bad) < _MAX_REPORTED:
                    bad.append((number, why))
                continue
            blocks = -(-n_in // block_tokens)
            ids = tuple(range(next_id, next_id + blocks))
            next_id += blocks
            requests.append(Request(len(requests), arrived, n_in, n_out, ids, number))
    if total_bad:
        raise _bad_lines_error(path, bad, total_bad)
    return _finish(shown(path.name), requests, block_tokens)


def _finish(name: str, requests: list[Request], block_tokens: int) -> Trace:
    if not requests:
        raise CtxlabError(f"trace {name} holds no requests")
    requests.sort(key=lambda r: (r.arrival, r.index))  # stable: ties keep file order
    for i, req in enumerate(requests):
        req.index = i
    return Trace(name, requests, block_tokens)


def load_trace(spec: str, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> Trace:
    """A trace from a file path (.jsonl or .csv) or a `synthetic:` generator spec."""
    if spec.startswith("synthetic:") or spec == "synthetic":
        return generate_from_spec(spec.partition(":")[2], block_tokens=block_tokens)
    path = Path(spec)
    if not path.exists() and not path.is_symlink():
        raise CtxlabError(
            f"trace {shown(spec)!r} does not exist (give a .jsonl/.csv file or synthetic:...)"
        )
    check_input_file(path, "trace", "a .jsonl or .csv file")  # a FIFO is refused, not read
    if path.suffix.lower() == ".csv":
        return read_csv(path, block_tokens)
    return read_mooncake(path, block_tokens)
