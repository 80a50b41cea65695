"""Replay timed requests through the real engine in real time (the engine half of calibration).

Each request is added when the wall clock passes its arrival time, between engine steps, as
a server loop would: a request that arrives during a step waits for that step to end. TTFT is
measured from the scheduled arrival (not from when `add_request` ran), so that wait is
counted, as a client would count it. When nothing is running the loop sleeps until the next
arrival. Every step is timed and counted with `StepRecorder`, so the replay's own steps can be
checked against a profile afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ctxlab.engine.llm_engine import LLMEngine
from ctxlab.engine.profile import StepRecord, StepRecorder
from ctxlab.engine.sampling import SamplingParams


@dataclass(frozen=True)
class TimedRequest:
    arrival: float  # seconds after the replay starts
    prompt_ids: list[int]
    max_tokens: int


@dataclass
class ReplayedRequest:
    """One request's outcome; times are seconds from the replay start."""

    arrival: float
    first_token: float
    finish: float
    output_tokens: int
    prompt_tokens: int
    reused_tokens: int
    preemptions: int
    completions: int  # how many times the engine reported it finished (must be 1)


@dataclass
class ReplayResult:
    requests: list[ReplayedRequest]  # in the order given
    steps: list[StepRecord]
    wall_s: float


def replay(
    engine: LLMEngine,
    jobs: list[TimedRequest],
    on_finish: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Run `jobs` through `engine` in real time; EOS is ignored so each request produces
    exactly `max_tokens` tokens. The clock is `time.perf_counter`, the engine's own."""
    clock = time.perf_counter
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].arrival)
    rec = StepRecorder(engine)
    rid_of: dict[int, int] = {}  # engine request id -> job index
    completions = [0] * len(jobs)
    t0 = clock()
    nxt = 0
    while True:
        now = clock() - t0
        while nxt < len(order) and jobs[order[nxt]].arrival <= now:
            j = order[nxt]
            params = SamplingParams(max_tokens=jobs[j].max_tokens, ignore_eos=True)
            rid_of[engine.add_request(jobs[j].prompt_ids, params)] = j
            nxt += 1
        if engine.has_unfinished():
            for ev in rec.step():
                if ev.finished:
                    completions[rid_of[ev.request_id]] += 1
                    if on_finish is not None:
                        on_finish(rid_of[ev.request_id])
        elif nxt < len(order):
            time.sleep(max(0.0, jobs[order[nxt]].arrival - (clock() - t0)))
        else:
            break
    wall = clock() - t0
    out: list[ReplayedRequest | None] = [None] * len(jobs)
    for rid, j in rid_of.items():
        m = engine.seqs[rid].metrics
        out[j] = ReplayedRequest(
            arrival=jobs[j].arrival,
            first_token=(m.first_token_time or float("nan")) - t0,
            finish=(m.finish_time or float("nan")) - t0,
            output_tokens=m.output_tokens,
            prompt_tokens=m.prompt_tokens,
            reused_tokens=m.reused_tokens,
            preemptions=m.preemptions,
            completions=completions[j],
        )
        del engine.seqs[rid]
    if any(r is None for r in out):
        raise AssertionError("a replayed request was never added to the engine")
    return ReplayResult([r for r in out if r is not None], rec.steps, wall)
