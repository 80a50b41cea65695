"""What the simulator tracks: per-request state, event counters and the usage timeline.

Kept apart from the event loop so the loop file reads as the scheduling policy alone. `Seq`
uses __slots__ and integer counts because a production hour holds tens of thousands of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ctxlab.sim.pool import Entry
from ctxlab.sim.trace import Request

WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3


class Seq:
    """A request's state inside the simulator (integer counts only)."""

    __slots__ = (
        "admit_seq",
        "admitted_at",
        "arrival",
        "computed",
        "entries",
        "finish",
        "first_token",
        "generated",
        "hit_tokens",
        "last_token",
        "out",
        "owned",
        "pages",
        "preemptions",
        "prefilled",
        "private",
        "ready_at",
        "req",
        "reused",
        "reused_tier",
        "state",
        "target",
    )

    def __init__(self, req: Request, arrival: float, prefilled: bool = False) -> None:
        self.req = req
        self.arrival = arrival
        self.prefilled = prefilled  # disaggregated decode side: KV arrives computed
        self.out = req.output_len
        self.state = WAITING
        self.computed = 0
        # A prefilled request's first token is the decode side's to emit (the prefill side's
        # is discarded, as a P/D proxy does): TTFT includes the transfer and that step.
        self.generated = 0
        self.target = 0
        self.pages = 0  # pages this request can write into (shared + private)
        self.private = 0
        self.entries: list[Entry] = []
        # blocks this request computes, not yet committed, in prompt order, each with the
        # token its pages end at: committed (owner None) once `computed` reaches that token
        self.owned: list[tuple[int, Entry]] = []
        self.ready_at = 0.0
        self.admit_seq = 0
        self.admitted_at = -1.0
        self.first_token = -1.0
        self.last_token = -1.0
        self.finish = -1.0
        self.reused = -1  # reused tokens at first admission (-1: not yet admitted)
        self.reused_tier = 0
        self.hit_tokens = 0
        self.preemptions = 0


@dataclass
class Counters:
    """Token and event totals; conservation tests add these up."""

    queried_tokens: int = 0
    reused_tokens: int = 0
    reused_tier_tokens: int = 0
    computed_tokens: int = 0  # first-admission prefill work: queried - reused
    recomputed_tokens: int = 0  # prefill run beyond computed_tokens: the cost of preemption
    prefill_tokens_run: int = 0
    decode_tokens_run: int = 0
    tokens_emitted: int = 0
    hit_requests: int = 0
    preemptions: int = 0
    transfer_bytes: int = 0
    steps: int = 0
    peak_running: int = 0


@dataclass
class Timeline:
    """Samples of pool and tier usage over simulated time, and step durations for ITL."""

    time: list[float] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    tier: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    itl_durations: list[np.ndarray] = field(default_factory=list)
    itl_counts: list[int] = field(default_factory=list)
    itl_extra: list[float] = field(default_factory=list)  # gaps across a preemption

    def itl_samples(self) -> np.ndarray:
        parts = [np.repeat(d, c) for d, c in zip(self.itl_durations, self.itl_counts, strict=True)]
        parts.append(np.asarray(self.itl_extra, dtype=np.float64))
        return np.concatenate(parts) if parts else np.zeros(0)
