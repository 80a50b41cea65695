"""Per-request timing and token counts.

TTFT = first token time - arrival; ITL = the gaps between consecutive tokens;
TPOT = (latency - TTFT) / (output tokens - 1). Percentiles interpolate linearly
(`ctxlab.stats.percentile`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens served by the prefix cache at admission
    output_tokens: int = 0
    preemptions: int = 0
    resident_kv_bytes: int = 0  # bytes of pool blocks the request held at its end

    @property
    def ttft(self) -> float:
        return (self.first_token_time or math.nan) - self.arrival_time

    @property
    def latency(self) -> float:
        return (self.finish_time or math.nan) - self.arrival_time

    @property
    def itl(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def tpot(self) -> float:
        if self.output_tokens < 2:
            return math.nan
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "output_tokens": self.output_tokens,
            "ttft_s": self.ttft,
            "tpot_s": self.tpot,
            "latency_s": self.latency,
            "itl_s": self.itl,
            "preemptions": self.preemptions,
            "resident_kv_bytes": self.resident_kv_bytes,
        }
