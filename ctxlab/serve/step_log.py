"""`ctxlab serve --step-log FILE`: every engine step the server ran, one JSON line each.

A line holds the four load counts a step profile prices (`ctxlab.sim.steptime`), the step's
seconds, its wall-clock start (Unix seconds, so a client can pick out the steps of its own
run) and how long the engine sat idle before it (null for the first step). The lines are
steps of the profile format, so a replay's own steps can be fitted like a profile.

Why: when the simulator, run from a profile, misses what a replay observed, the step log
splits the miss in two: what each real step cost against what the profile priced it at, and
how the requests were scheduled into steps. It also shows costs the profile's load counts
cannot see, such as a step after a long idle period running slower (see docs/deployment.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TextIO

from ctxlab.engine.llm_engine import LLMEngine
from ctxlab.engine.profile import StepRecord, StepRecorder
from ctxlab.engine.request import TokenEvent
from ctxlab.errors import CtxlabError


class StepLog:
    """Runs the engine's steps through a `StepRecorder` and appends each to a file."""

    def __init__(self, engine: LLMEngine, path: Path) -> None:
        try:
            self._file: TextIO = path.open("a", buffering=1, encoding="utf-8")
        except OSError as exc:
            raise CtxlabError(f"--step-log {path} cannot be written: {exc.strerror}.") from None
        self._recorder = StepRecorder(engine, sink=self._write)
        self._start = 0.0  # wall clock at the start of the running step
        self._idle: float | None = None
        self._last_end: float | None = None  # perf_counter at the end of the last step

    def step(self, detokenize: bool) -> list[TokenEvent]:
        now = time.perf_counter()
        self._idle = None if self._last_end is None else now - self._last_end
        self._start = time.time()
        try:
            return self._recorder.step(detokenize=detokenize)
        finally:
            self._last_end = time.perf_counter()

    def _write(self, record: StepRecord) -> None:
        if not (record.prefill_tokens or record.decode_tokens):
            return  # a step that computed nothing (every request waited) prices nothing
        line = {"start": round(self._start, 6), **asdict(record)}
        line["seconds"] = round(record.seconds, 6)
        line["idle_before"] = None if self._idle is None else round(self._idle, 6)
        self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._file.close()
