"""Seeded synthetic traces: arrivals, lengths, shared prefixes and multi-turn sessions.

Spec (after `synthetic:`), comma-separated `key=value`, all optional:
  n=200              requests in the trace
  rate=2.0           sessions started per second
  arrival=poisson    or gamma (bursty): gaps with coefficient of variation `cv`
  cv=2.0             burstiness of gamma arrivals (1.0 is Poisson)
  input=lognormal:2048:0.8   new user tokens per turn: N | uniform:A:B | lognormal:MEDIAN:SIGMA
  output=lognormal:256:0.6   output tokens per turn, same forms
  groups=0           shared-prefix groups (a system prompt each); 0 = none
  prefix=1024        tokens of each group's shared prefix
  turns=1            turns per session; turn k+1 re-sends turn k's input and output
  think=10.0         mean seconds between the turns of a session (exponential)
  max_input=65536    a session stops once its history would pass this
  seed=0

Block ids follow content: a block's id is interned from (parent id, the segments it holds),
so equal ids mean equal prefixes, exactly as in a Mooncake trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ctxlab.arch.limits import MAX_TOKENS
from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_seed
from ctxlab.sim.requests import DEFAULT_BLOCK_TOKENS, Request, Trace, check_block_tokens


@dataclass(frozen=True)
class SyntheticSpec:
    n: int = 200
    rate: float = 2.0
    arrival: str = "poisson"
    cv: float = 2.0
    input: str = "lognormal:2048:0.8"
    output: str = "lognormal:256:0.6"
    groups: int = 0
    prefix: int = 1024
    turns: int = 1
    think: float = 10.0
    max_input: int = 65536
    seed: int = 0


_INT_KEYS = {"n", "groups", "prefix", "turns", "max_input", "seed"}
_FLOAT_KEYS = {"rate", "cv", "think"}
_STR_KEYS = {"arrival", "input", "output"}


def parse_spec(text: str) -> SyntheticSpec:
    """Parse `key=value,...`; an unknown key or bad value is one sentence."""
    values: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, raw = part.partition("=")
        key = key.strip()
        if not eq:
            raise CtxlabError(f"synthetic option {part!r} needs the form key=value")
        if key in _INT_KEYS:
            try:
                values[key] = int(raw)
            except ValueError:
                raise CtxlabError(
                    f"synthetic option {key} must be an integer, got {raw!r}"
                ) from None
        elif key in _FLOAT_KEYS:
            try:
                values[key] = float(raw)
            except ValueError:
                raise CtxlabError(f"synthetic option {key} must be a number, got {raw!r}") from None
        elif key in _STR_KEYS:
            values[key] = raw.strip()
        else:
            known = ", ".join(sorted(_INT_KEYS | _FLOAT_KEYS | _STR_KEYS))
            raise CtxlabError(f"unknown synthetic option {key!r}; known: {known}")
    spec = SyntheticSpec(**values)  # type: ignore[arg-type]
    _validate(spec)
    return spec


MAX_REQUESTS = 1_000_000  # requests in one synthetic trace (a real hour holds ~12,000)


def _validate(spec: SyntheticSpec) -> None:
    if spec.n <= 0 or spec.turns <= 0:
        raise CtxlabError("synthetic n and turns must be positive")
    check_seed(spec.seed, "synthetic seed")
    if spec.n * spec.turns > MAX_REQUESTS or spec.groups > MAX_REQUESTS:
        raise CtxlabError(
            f"synthetic n x turns ({spec.n * spec.turns:,}) or groups is absurdly large; "
            f"ctxlab accepts up to {MAX_REQUESTS:,} requests"
        )
    if not all(math.isfinite(v) for v in (spec.rate, spec.cv, spec.think)):
        raise CtxlabError("synthetic rate, cv and think must be finite numbers")
    if spec.rate <= 0 or spec.cv <= 0 or spec.think < 0:
        raise CtxlabError("synthetic rate and cv must be positive and think non-negative")
    if spec.prefix > MAX_TOKENS or spec.max_input > MAX_TOKENS:
        raise CtxlabError(
            f"synthetic prefix or max_input is absurdly large; ctxlab accepts up to "
            f"{MAX_TOKENS:,} tokens"
        )
    if spec.arrival not in ("poisson", "gamma"):
        raise CtxlabError(f"synthetic arrival must be poisson or gamma, got {spec.arrival!r}")
    if spec.groups < 0 or spec.prefix < 0 or spec.max_input <= 0:
        raise CtxlabError("synthetic groups and prefix must be non-negative, max_input positive")
    for name in ("input", "output"):
        _sampler(getattr(spec, name), name)


def _sampler(text: str, name: str):
    """A function rng -> positive int for a length distribution spec."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            value = int(parts[0])
            if not 0 < value <= MAX_TOKENS:
                raise ValueError
            return lambda rng: value
        if parts[0] == "uniform" and len(parts) == 3:
            lo, hi = int(parts[1]), int(parts[2])
            if not 0 < lo <= hi <= MAX_TOKENS:
                raise ValueError
            return lambda rng: int(rng.integers(lo, hi + 1))
        if parts[0] == "lognormal" and len(parts) == 3:
            median, sigma = float(parts[1]), float(parts[2])
            if not (0 < median <= MAX_TOKENS and 0 <= sigma <= 10):
                raise ValueError
            mu = math.log(median)
            return lambda rng: max(1, min(MAX_TOKENS, round(float(rng.lognormal(mu, sigma)))))
    except ValueError:
        pass
    raise CtxlabError(
        f"synthetic {name} length {text!r} is not N, uniform:A:B or lognormal:MEDIAN:SIGMA "
        f"with positive numbers (lengths up to {MAX_TOKENS:,}, SIGMA up to 10)"
    )


class _BlockIds:
    """Interns block contents to ids so that equal prefixes get equal ids."""

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}

    def chain(self, segments: list[tuple[int, int]], block: int) -> tuple[int, ...]:
        out: list[int] = []
        parent = -1
        pieces: list[tuple[int, int, int]] = []
        filled = 0
        for seg_id, length in segments:
            start = 0
            while start < length:
                take = min(block - filled, length - start)
                pieces.append((seg_id, start, start + take))
                filled += take
                start += take
                if filled == block:
                    parent = self.ids.setdefault((parent, tuple(pieces)), len(self.ids))
                    out.append(parent)
                    pieces, filled = [], 0
        if pieces:
            out.append(self.ids.setdefault((parent, tuple(pieces)), len(self.ids)))
        return tuple(out)


def generate(spec: SyntheticSpec, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> Trace:
    """Build the trace the spec describes; the same spec and seed give the same trace."""
    check_block_tokens(block_tokens)
    rng = np.random.default_rng(spec.seed)
    draw_in = _sampler(spec.input, "input")
    draw_out = _sampler(spec.output, "output")
    ids = _BlockIds()
    sessions = -(-spec.n // spec.turns)
    mean_gap = 1.0 / spec.rate
    if spec.arrival == "gamma":
        shape = 1.0 / (spec.cv * spec.cv)
        gaps = rng.gamma(shape, mean_gap / shape, size=sessions)
    else:
        gaps = rng.exponential(mean_gap, size=sessions)
    starts = np.cumsum(gaps) - gaps[0]
    next_seg = 0
    group_seg = []
    for _ in range(spec.groups):
        group_seg.append(next_seg)
        next_seg += 1
    raw: list[tuple[float, int, int, tuple[int, ...]]] = []
    for s in range(sessions):
        history: list[tuple[int, int]] = []
        if spec.groups and spec.prefix:
            history.append((group_seg[int(rng.integers(spec.groups))], spec.prefix))
        t = float(starts[s])
        for turn in range(spec.turns):
            if turn:
                t += float(rng.exponential(spec.think)) if spec.think else 0.0
            user = (next_seg, draw_in(rng))
            next_seg += 1
            n_out = draw_out(rng)
            prompt = [*history, user]
            n_in = sum(length for _, length in prompt)
            if n_in > spec.max_input:
                break
            raw.append((t, n_in, n_out, ids.chain(prompt, block_tokens)))
            history = [*prompt, (next_seg, n_out)]
            next_seg += 1
    raw.sort(key=lambda r: r[0])
    raw = raw[: spec.n]
    requests = [
        Request(i, arrival, n_in, n_out, chain, 0)
        for i, (arrival, n_in, n_out, chain) in enumerate(raw)
    ]
    if not requests:
        raise CtxlabError("the synthetic spec produced no requests (is max_input too small?)")
    return Trace(f"synthetic(seed={spec.seed})", requests, block_tokens)


def generate_from_spec(text: str, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> Trace:
    return generate(parse_spec(text), block_tokens)
