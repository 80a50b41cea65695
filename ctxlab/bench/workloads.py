"""What a benchmark sends: random prompts, shared-prefix groups, multi-turn chats, or a
Mooncake trace replayed with its timestamps.

Every prompt is made of words from `ctxlab.bench.words` (one token each on the default
model), drawn from a seeded generator, so the same seed sends the same text. A trace's text
comes from its `hash_ids`: each id stands for one block of `hash_block` words drawn from a
generator seeded by the id alone, so identical ids are identical text (and tokens) in every
request and every run, and the server's prefix cache sees the trace's real reuse; a partial
last block is the first words of its id's block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ctxlab.bench.words import WORDS, text_of
from ctxlab.errors import CtxlabError

_TRACE_SEED = 0x6D6F6F6E  # fixed: a trace's text must not depend on --seed

# A replay waits for every arrival in real time, and builds every prompt before the first
# request: a trace whose last request comes 31 years after its first (a typo in one
# timestamp) would make `bench serve` wait for it, one with 10^9-token outputs would be
# sent as asked and summarised as if a server could answer it. Both are refused up front.
MAX_REPLAY_S = 24 * 3600.0  # a day of replay; longer needs --trace-time-scale
MAX_REQUEST_TOKENS = 10_000_000  # prompt plus output: the largest context published (10M)
MAX_PROMPT_WORDS = 200_000_000  # every prompt's words at once (~1.6 GB of text and ids)


@dataclass
class BenchRequest:
    """One request (or one conversation: a user turn per entry of `turns`)."""

    index: int
    prompt: str  # the first user text (the whole prompt for single requests)
    prompt_len: int  # planned tokens of `prompt`
    output_len: int
    arrival: float | None = None  # seconds from the start (traces); None: the arrival process
    turns: list[str] = field(default_factory=list)  # later user turns (multi-turn)


def _words(rng: np.random.Generator, n: int) -> str:
    return text_of(rng.integers(0, len(WORDS), size=n).tolist())


def _lengths(rng: np.random.Generator, n: int, mean: int, ratio: float) -> list[int]:
    """vLLM's random lengths: uniform integers in [mean(1 - ratio), mean(1 + ratio)], at least 1."""
    lo, hi = max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))
    return rng.integers(lo, hi + 1, size=n).tolist()


def check_lengths(input_len: int, output_len: int, ratio: float) -> None:
    if input_len < 1 or output_len < 1:
        raise CtxlabError("--input-len and --output-len must be at least 1 token.")
    if not 0 <= ratio < 1:
        raise CtxlabError(f"--range-ratio must be in [0, 1), got {ratio}.")


def random_requests(
    n: int, input_len: int, output_len: int, ratio: float, seed: int
) -> list[BenchRequest]:
    check_lengths(input_len, output_len, ratio)
    rng = np.random.default_rng([seed, 1])
    ins = _lengths(rng, n, input_len, ratio)
    outs = _lengths(rng, n, output_len, ratio)
    return [BenchRequest(i, _words(rng, ins[i]), ins[i], outs[i]) for i in range(n)]


def shared_prefix_requests(
    n: int, num_prefixes: int, prefix_len: int, input_len: int, output_len: int, seed: int
) -> list[BenchRequest]:
    """Request i = prefix (i mod num_prefixes) + its own `input_len` words."""
    check_lengths(input_len, output_len, 0.0)
    if num_prefixes < 1 or prefix_len < 1:
        raise CtxlabError("--num-prefixes and --prefix-len must be at least 1.")
    prefixes = [
        _words(np.random.default_rng([seed, 2, g]), prefix_len) for g in range(num_prefixes)
    ]
    rng = np.random.default_rng([seed, 3])
    return [
        BenchRequest(i, prefixes[i % num_prefixes] + _words(rng, input_len),
                     prefix_len + input_len, output_len)
        for i in range(n)
    ]  # fmt: skip


def multi_turn_requests(
    n: int, turns: int, input_len: int, output_len: int, seed: int
) -> list[BenchRequest]:
    """n conversations of `turns` user turns of `input_len` words each."""
    check_lengths(input_len, output_len, 0.0)
    if turns < 1:
        raise CtxlabError(f"--turns must be at least 1, got {turns}.")
    rng = np.random.default_rng([seed, 4])
    out = []
    for i in range(n):
        texts = [_words(rng, input_len).lstrip() for _ in range(turns)]
        out.append(BenchRequest(i, texts[0], input_len, output_len, turns=texts[1:]))
    return out


def trace_requests(
    path: Path, hash_block: int, limit: int | None, time_scale: float
) -> list[BenchRequest]:
    """A Mooncake JSONL trace: arrivals from its timestamps (times `time_scale`), prompts from
    its hash ids, output lengths as recorded."""
    from ctxlab.sim.trace import read_mooncake  # torch-free, checks every line

    if not time_scale > 0:
        raise CtxlabError(f"--trace-time-scale must be positive, got {time_scale}.")
    trace = read_mooncake(path, hash_block)
    reqs = trace.requests[:limit] if limit else trace.requests
    t0 = reqs[0].arrival
    _check_trace(path, reqs, time_scale)
    blocks: dict[int, list[int]] = {}
    out = []
    for r in reqs:
        ids: list[int] = []
        for k, h in enumerate(r.hash_ids):
            size = min(hash_block, r.input_len - k * hash_block)
            if h not in blocks:
                rng = np.random.default_rng([_TRACE_SEED, h])
                blocks[h] = rng.integers(0, len(WORDS), size=hash_block).tolist()
            ids.extend(blocks[h][:size])
        arrival = (r.arrival - t0) * time_scale
        out.append(BenchRequest(len(out), text_of(ids), r.input_len, r.output_len, arrival))
    return out


def _check_trace(path: Path, reqs: list, time_scale: float) -> None:
    """Durations and sizes a replay can hold, checked before any prompt is built."""
    span = (reqs[-1].arrival - reqs[0].arrival) * time_scale
    if span > MAX_REPLAY_S:
        last = max(range(len(reqs)), key=lambda i: reqs[i].arrival)
        fits = MAX_REPLAY_S / max(span / time_scale, 1e-9)
        raise CtxlabError(
            f"trace {path}: replaying it takes {duration(span)} (line {reqs[last].line} arrives "
            f"that long after the first), past the {duration(MAX_REPLAY_S)} a replay may "
            f"wait; give --trace-time-scale {fits:.3g} or less, or fewer --num-prompts."
        )
    big = next((r for r in reqs if r.input_len + r.output_len > MAX_REQUEST_TOKENS), None)
    if big is not None:
        raise CtxlabError(
            f"trace {path} line {big.line}: {big.input_len:,} prompt and {big.output_len:,} "
            f"output tokens, past the {MAX_REQUEST_TOKENS:,} tokens of the longest context any "
            "model serves; no server can answer it."
        )
    words = sum(r.input_len for r in reqs)
    if words > MAX_PROMPT_WORDS:
        raise CtxlabError(
            f"trace {path}: its prompts hold {words:,} tokens in all, past the "
            f"{MAX_PROMPT_WORDS:,} a replay builds in memory; give fewer --num-prompts."
        )


def duration(seconds: float) -> str:
    """A span as a person reads it (years, days, hours or seconds)."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600)):
        if seconds >= 2 * size:
            n = seconds / size
            return f"{n:,.1f} {unit}" if n < 1e6 else f"{n:.3g} {unit}"  # not 300 digits
    return f"{seconds:,.0f} s"
