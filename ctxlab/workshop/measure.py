"""Small measuring helpers the demonstrations share: one request timed, spreads, timers.

Times come from the engine's own per-request records (arrival, first token, every token);
CPU time from the process clock around the request, so a shared machine's other work does
not count as this request's cost.
"""

from __future__ import annotations

import math
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ctxlab.stats import percentile

if TYPE_CHECKING:
    from ctxlab.engine import LLM
    from ctxlab.engine.metrics import RequestMetrics
    from ctxlab.workshop.server_backend import ServerLLM


@dataclass(frozen=True)
class Sent:
    """One finished request: what the engine recorded of it (copied out, so a demonstration's
    records stay plain frozen values) and the CPU seconds it took."""

    ttft_ms: float
    tpot_ms: float
    itl_s: tuple[float, ...]  # gaps between consecutive output tokens, in seconds
    prompt_tokens: int
    reused: int  # prompt tokens served by the prefix cache at admission
    resident_kv_bytes: int | None  # None where a server does not tell them
    cpu_s: float

    @property
    def recomputed(self) -> int:
        return self.prompt_tokens - self.reused

    @classmethod
    def of(cls, metrics: RequestMetrics, cpu_s: float) -> Sent:
        return cls(
            metrics.ttft * 1e3,
            metrics.tpot * 1e3,
            tuple(metrics.itl),
            metrics.prompt_tokens,
            metrics.reused_tokens,
            metrics.resident_kv_bytes,
            cpu_s,
        )


def send(llm: LLM | ServerLLM, ids: list[int], max_tokens: int, salt: str | None = None) -> Sent:
    """Run one request alone to completion (EOS ignored, so it makes `max_tokens` tokens)."""
    from ctxlab.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    cpu = time.process_time()
    (out,) = llm.generate([ids], params, cache_salt=salt)
    return Sent.of(out.metrics, time.process_time() - cpu)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far repeated measurements of one thing scatter."""
    if len(values) < 2:
        return math.nan
    mid = median(values)
    return (max(values) - min(values)) / mid if mid else math.nan


def pct(values: Sequence[float], q: float) -> float:
    return percentile(list(values), q)


class Timer:
    """Wall and CPU seconds of a block of work (CPU: this process and its children)."""

    def __enter__(self) -> Timer:
        self.wall0, self.cpu0 = time.perf_counter(), cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self.wall0
        self.cpu_s = cpu_seconds() - self.cpu0


def cpu_seconds() -> float:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (empty where /proc/loadavg does not exist)."""
    try:
        with open("/proc/loadavg", encoding="utf-8") as fh:
            return [float(x) for x in fh.read().split()[:3]]
    except OSError:
        return []
