"""What one benchmark run measured, with `vllm bench serve`'s definitions.

Per request, as the client saw it (seconds, one monotonic clock):
- TTFT: from sending the request to the first chunk that carries text;
- ITL: every gap between consecutive text chunks; all requests' gaps are pooled;
- E2EL: from sending to the last chunk with choices;
- TPOT: (E2EL - TTFT) / (output tokens - 1), for requests with more than one output token.

Output tokens are the server's `usage.completion_tokens` when it reports them, else the
number of text chunks (no tokenizer is needed, so any server can be measured). Input tokens
are the server's `usage.prompt_tokens` when reported, else the planned prompt length.

Over the run: mean, median, standard deviation and chosen percentiles (linear interpolation
between order statistics, numpy's default); request, output-token and total-token throughput
over the run's duration; goodput = requests meeting every given SLO (TTFT, TPOT, E2EL in ms;
a one-token request counts TPOT 0, as vLLM) per second; peak output-token throughput and peak
concurrency counted per one-second bucket from the first request's start, as vLLM does.

Beyond vLLM's keys, every median and percentile carries its sample size and a 95 %
percentile-bootstrap interval (`samples` and `intervals` in the summary; the printed block
adds its own lines after vLLM's): TTFT repeats scatter by tens of percent, so a P99 of 20
requests is one request and reads nothing without its n. A percentile with fewer than five
values beyond it gets no interval ("n/a"): the bootstrap cannot say more than its last few
order statistics there. ITL gaps of one request are correlated, so the ITL intervals
resample whole requests, not pooled gaps. The bootstrap is
`ctxlab.stats`'s method (percentile interval, seeded, the same linear-interpolation
percentile), vectorised with numpy here because ITL pools every gap of every request
(thousands of values), where the pure-Python loop would take seconds per figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctxlab.errors import CtxlabError
from ctxlab.stats import RESAMPLES, SEED, Interval

METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_KEYS = ("ttft", "tpot", "e2el")


@dataclass
class RequestResult:
    """One request as the client saw it."""

    index: int
    prompt_len: int  # planned prompt tokens
    success: bool = False
    start: float = 0.0  # seconds since the run started
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int | None = None  # usage.completion_tokens
    prompt_tokens: int | None = None  # usage.prompt_tokens
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    chunks: int = 0  # text chunks received
    text: str = ""
    error: str = ""

    @property
    def output_len(self) -> int:
        return self.output_tokens if self.output_tokens is not None else self.chunks

    @property
    def input_len(self) -> int:
        return self.prompt_tokens if self.prompt_tokens is not None else self.prompt_len

    @property
    def tpot(self) -> float:
        """0 for a one-token answer (vLLM's goodput convention)."""
        n = self.output_len
        return (self.latency - self.ttft) / (n - 1) if n > 1 else 0.0


def parse_percentiles(text: str) -> list[float]:
    try:
        values = [float(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError:
        raise CtxlabError(f"--metric-percentiles {text!r} must be numbers like 50,90,99.") from None
    if not values or any(not 0 < p <= 100 for p in values):
        raise CtxlabError(f"--metric-percentiles {text!r} must lie in (0, 100].")
    return values


def parse_metric_names(text: str) -> list[str]:
    names = [n for n in text.replace(" ", "").split(",") if n]
    bad = [n for n in names if n not in METRICS]
    if bad or not names:
        raise CtxlabError(
            f"--percentile-metrics {text!r}: use a comma list of {', '.join(METRICS)}."
        )
    return names


def parse_goodput(items: list[str]) -> dict[str, float]:
    """`["ttft:300 tpot:50"]` or `["ttft:300", "e2el:2000"]` -> SLOs in milliseconds."""
    slos: dict[str, float] = {}
    for item in items:
        for part in item.replace(",", " ").split():
            key, _, value = part.partition(":")
            if key not in GOODPUT_KEYS:
                raise CtxlabError(
                    f"--goodput {part!r}: the metric must be one of {', '.join(GOODPUT_KEYS)} "
                    "(e.g. ttft:300 tpot:50)."
                )
            try:
                ms = float(value)
            except ValueError:
                raise CtxlabError(
                    f"--goodput {part!r}: give milliseconds, e.g. {key}:300."
                ) from None
            if not ms > 0:
                raise CtxlabError(f"--goodput {part!r}: the SLO must be positive milliseconds.")
            slos[key] = ms
    return slos


def _stats(name: str, values: list[float], percentiles: list[float]) -> dict[str, float]:
    arr = np.asarray(values or [0.0], dtype=np.float64) * 1000.0  # ms, 0 when empty (vLLM)
    out = {
        f"mean_{name}_ms": float(arr.mean()),
        f"median_{name}_ms": float(np.median(arr)),
        f"std_{name}_ms": float(arr.std()),
    }
    for p in percentiles:
        out[f"p{p_word(p)}_{name}_ms"] = float(np.percentile(arr, p, method="linear"))
    return out


_CHUNK = 2_000_000  # resampled values held at once (16 MB of float64)
MIN_TAIL = 5  # values needed beyond a percentile (on its nearer side) for an interval


def too_few(n: int, q: float) -> bool:
    """Whether n values are too few for a bootstrap interval of percentile q: the resampled
    percentile then only moves between the last few order statistics, and the interval says
    nothing (a P99 needs 500 values, a median 10)."""
    return n * min(q, 100.0 - q) / 100.0 < MIN_TAIL


def quantile_intervals(
    values_ms: list[float],
    qs: list[float],
    resamples: int = RESAMPLES,
    seed: int = SEED,
    groups: list[int] | None = None,
) -> list[Interval]:
    """95 % percentile-bootstrap intervals of the percentiles `qs` (0..100) of one sample.

    Every resample draws n values with replacement; all `qs` are read from the same
    resamples. n = 0 gives no interval; a constant sample (or n = 1) a zero-wide one, as
    `ctxlab.stats.bootstrap`; a percentile with fewer than MIN_TAIL values beyond it gets
    its point and no interval (method "too few"). `groups`: the sizes of consecutive runs
    of values that belong together (one request's gaps, which are correlated); resamples
    then draw whole groups, and there must be MIN_TAIL groups too."""
    n = len(values_ms)
    if n == 0:
        return [Interval(math.nan, math.nan, math.nan, 0, "none") for _ in qs]
    arr = np.asarray(values_ms, dtype=np.float64)
    points = [float(np.percentile(arr, q, method="linear")) for q in qs]
    if n == 1 or arr.min() == arr.max():
        return [Interval(p, p, p, n, "bootstrap") for p in points]
    rng = np.random.default_rng(seed)
    if groups is not None:
        stats = _group_resamples(arr, groups, qs, resamples, rng)
        method = "bootstrap by request"
    else:
        per_chunk = max(1, _CHUNK // n)
        draws = []
        for start in range(0, resamples, per_chunk):
            rows = min(per_chunk, resamples - start)
            sample = arr[rng.integers(0, n, size=(rows, n))]
            draws.append(np.percentile(sample, qs, axis=1, method="linear"))  # (len(qs), rows)
        stats = np.concatenate(draws, axis=1)
        method = "bootstrap"
    lows = np.percentile(stats, 2.5, axis=1, method="linear")
    highs = np.percentile(stats, 97.5, axis=1, method="linear")
    few = len(groups) < MIN_TAIL if groups is not None else False
    return [
        Interval(p, math.nan, math.nan, n, "too few")
        if few or too_few(n, q)
        else Interval(p, float(lo), float(hi), n, method)
        for p, q, lo, hi in zip(points, qs, lows, highs, strict=True)
    ]


def _group_resamples(
    arr: np.ndarray, groups: list[int], qs: list[float], resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """(len(qs), resamples) percentiles of resamples that draw whole groups."""
    sizes = np.asarray(groups, dtype=np.int64)
    if sizes.sum() != len(arr) or (sizes < 0).any():
        raise ValueError("groups must be sizes that add up to the number of values")
    k = len(sizes)
    member = np.repeat(np.arange(k), sizes)  # the group of every value
    out = np.empty((len(qs), resamples))
    for row in range(resamples):
        picks = np.bincount(rng.integers(0, k, size=k), minlength=k)
        pooled = np.repeat(arr, picks[member])
        if pooled.size == 0:  # only empty groups drawn
            pooled = arr
        out[:, row] = np.percentile(pooled, qs, method="linear")
    return out


def _intervals(
    name: str, values: list[float], percentiles: list[float], groups: list[int] | None = None
) -> dict[str, Any]:
    """{vLLM key: interval} for the median and every percentile of one metric (ms)."""
    qs = [50.0, *percentiles]
    keys = [f"median_{name}_ms", *(f"p{p_word(p)}_{name}_ms" for p in percentiles)]
    found = quantile_intervals([v * 1000.0 for v in values], qs, groups=groups)
    return {key: iv.to_json() for key, iv in zip(keys, found, strict=True)}


def p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def peaks(results: list[RequestResult]) -> tuple[float, float]:
    """(peak output tokens per second, peak concurrent requests), per one-second bucket."""
    ok = [r for r in results if r.success]
    if not ok:
        return 0.0, 0.0
    t0 = min(r.start for r in ok)
    span = max(r.start + r.latency for r in ok) - t0
    n = math.ceil(span) + 1
    tokens = np.zeros(n)
    running = np.zeros(n)
    for r in ok:
        t = r.start + r.ttft
        tokens[int(t - t0)] += 1
        for gap in r.itl:
            t += gap
            tokens[min(n - 1, int(t - t0))] += 1
        for s in range(int(r.start - t0), int(r.start + r.latency - t0) + 1):
            running[s] += 1
    return float(tokens.max()), float(running.max())


def summarize(
    results: list[RequestResult],
    duration: float,
    percentiles: list[float],
    goodput: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The run's figures under vLLM's JSON keys (plus cached input tokens)."""
    ok = [r for r in results if r.success]
    total_in = sum(r.input_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    ttfts = [r.ttft for r in ok]
    tpots = [r.tpot for r in ok if r.output_len > 1]
    itls = [g for r in ok for g in r.itl]
    e2els = [r.latency for r in ok]
    good = 0
    if goodput:
        for r in ok:
            measured = {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.latency}
            good += all(measured[k] * 1000.0 <= slo for k, slo in goodput.items())
    dur = duration if duration > 0 else math.nan
    peak_tok, peak_running = peaks(results)
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "cached_input_tokens": sum(cached) if cached else None,
        "request_throughput": len(ok) / dur,
        "request_goodput": good / dur if goodput else None,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
        "max_output_tokens_per_s": peak_tok,
        "max_concurrent_requests": peak_running,
    }
    samples: dict[str, int] = {}
    intervals: dict[str, Any] = {}
    itl_groups = [len(r.itl) for r in ok]  # a request's gaps are resampled together
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out.update(_stats(name, values, percentiles))
        samples[name] = len(values)
        groups = itl_groups if name == "itl" else None
        intervals.update(_intervals(name, values, percentiles, groups))
    out["samples"] = samples  # values behind each metric's median and percentiles
    out["intervals"] = intervals  # 95 % bootstrap interval per median/percentile key
    return out
