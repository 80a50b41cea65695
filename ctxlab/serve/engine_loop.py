"""The one thread that owns the engine; HTTP handlers only enqueue and read.

A handler submits its prompts (`submit`) and reads `Update`s from an asyncio queue; the
engine thread drains submissions and aborts between steps, runs `LLMEngine.step`, and hands
each step's updates back to the event loop in one thread-safe call. Nothing else touches
the engine (nor its tokenizer), so the engine needs no locks.

- The server holds at most `max_num_seqs` running plus `max_waiting` waiting requests: a
  request whose prompts would pass that refuses at once (`QueueFull`, which the app answers
  with 429 and Retry-After), and one with more prompts than the server ever holds is
  `TooManyPrompts` (400: retrying cannot help). An idle server admits a burst of up to
  `max_num_seqs + max_waiting` prompts, so only the prompts that really wait count as waiting.
- A request past its deadline is aborted by the engine thread (its blocks freed) and its
  handler told so.
- A request the engine refuses (`CtxlabError` at add time: prompt too long, over the
  policy's floor, too big for the pool) is a `refused` update with that sentence; one that
  fails inside a step ends with `finish_reason` "error" and the engine's `RequestError`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ctxlab.engine.llm_engine import LLMEngine
from ctxlab.engine.request import RequestOutput, TokenEvent
from ctxlab.engine.sampling import SamplingParams
from ctxlab.errors import CtxlabError
from ctxlab.serve.metrics import ServeMetrics
from ctxlab.serve.step_log import StepLog

log = logging.getLogger(__name__)

UpdateKind = Literal["admitted", "token", "done", "refused", "timeout"]


@dataclass
class Update:
    """What the engine thread tells a handler about one of its prompts."""

    kind: UpdateKind
    index: int  # which prompt of the HTTP request (completions take a batch)
    text: str = ""  # new text (token, done)
    output: RequestOutput | None = None  # done, timeout
    message: str = ""  # refused
    user_fault: bool = True  # refused: a 400 (True) or a 500 (False)
    completion_tokens: int = 0  # token: the prompt's output tokens so far (continuous usage)


@dataclass(eq=False)
class Ticket:
    """One prompt of one HTTP request, as both sides see it."""

    index: int
    prompt: Any  # text, token ids or chat messages
    max_tokens: int | None  # None: as many as the context and pool allow
    make_params: Callable[[int], SamplingParams]
    salt: str | None
    queue: asyncio.Queue
    arrival: float  # perf_counter when the handler submitted it
    deadline: float
    rid: int | None = None  # set by the engine thread at admission
    prompt_tokens: int = 0  # set by the engine thread at admission
    finished: bool = False  # set by the engine thread


@dataclass
class _Commands:
    submit: deque[Ticket] = field(default_factory=deque)
    abort: deque[Ticket] = field(default_factory=deque)


class QueueFull(Exception):
    """Admitting these prompts would leave more waiting than the server allows (429)."""


class TooManyPrompts(QueueFull):
    """One request has more prompts than the server ever holds at once (400)."""


class EngineLoop:
    def __init__(
        self,
        engine: LLMEngine,
        metrics: ServeMetrics,
        max_waiting: int = 256,
        request_timeout: float = 600.0,
        step_log: StepLog | None = None,
    ):
        self.engine = engine
        self.step_log = step_log
        self.metrics = metrics
        self.max_waiting = max_waiting
        self.request_timeout = request_timeout
        self.max_model_len = engine.max_position
        self.max_running = engine.scheduler.max_num_seqs
        self._cmd = _Commands()
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._tickets: dict[int, Ticket] = {}  # engine request id -> ticket (engine thread)
        self._waiting = 0  # engine's waiting count after the last step (read by handlers)
        self._running = 0  # and its running count

    # -- the event-loop side ----------------------------------------------------------------
    def start(self, aloop: asyncio.AbstractEventLoop) -> None:
        self._aloop = aloop
        self._thread = threading.Thread(target=self._run, name="ctxlab-engine", daemon=True)
        self._thread.start()
        self.metrics.observe_engine(self.engine)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def waiting(self) -> int:
        """Requests not yet admitted: the engine's waiting queue plus unprocessed submissions."""
        return self._waiting + len(self._cmd.submit)

    def new_ticket(
        self,
        index: int,
        prompt: Any,
        max_tokens: int | None,
        make_params: Callable[[int], SamplingParams],
        salt: str | None,
        queue: asyncio.Queue,
    ) -> Ticket:
        now = time.perf_counter()
        return Ticket(
            index, prompt, max_tokens, make_params, salt, queue, now, now + self.request_timeout
        )

    @property
    def running(self) -> int:
        """Requests admitted and running (the engine's count after the last step)."""
        return self._running

    def submit(self, tickets: list[Ticket]) -> None:
        """Hand prompts to the engine thread, or raise QueueFull (nothing is submitted).

        The rule counts running and waiting together against `max_running + max_waiting`:
        after admission, at most `max_waiting` of them are left without a running slot.
        """
        capacity = self.max_running + self.max_waiting
        asked = len(tickets)
        if asked > capacity:
            raise TooManyPrompts(
                f"this request has {asked} prompts, more than the server ever holds at once "
                f"({self.max_running} running + {self.max_waiting} waiting); split it."
            )
        with self._cond:
            running, waiting = self.running, self.waiting
            if running + waiting + asked > capacity:
                raise QueueFull(
                    f"the server is busy: {running} requests are running and {waiting} waiting, "
                    f"and {asked} more would pass its limit of {self.max_running} running + "
                    f"{self.max_waiting} waiting; retry later."
                )
            self._cmd.submit.extend(tickets)
            self._cond.notify()

    def abort(self, tickets: list[Ticket]) -> None:
        """Stop these prompts (a client went away); their blocks go back to the pool."""
        live = [t for t in tickets if not t.finished]
        if live:
            with self._cond:
                self._cmd.abort.extend(live)
                self._cond.notify()

    # -- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not (self._stop or self._cmd.submit or self._cmd.abort):
                    if engine.has_unfinished():
                        break
                    self._cond.wait(timeout=self._next_deadline())
                    if self._expire_due():
                        break
                if self._stop:
                    break
                submits, aborts = list(self._cmd.submit), list(self._cmd.abort)
                self._cmd.submit.clear()
                self._cmd.abort.clear()
            out: list[tuple[Ticket, Update]] = []
            for t in submits:
                self._add(t, out)
            for t in aborts:
                self._abort(t, out, "done")
            self._expire(out)
            if engine.has_unfinished():
                try:
                    if self.step_log is not None:
                        events = self.step_log.step(detokenize=True)
                    else:
                        events = engine.step(detokenize=True)
                except Exception:  # a scheduler-level fault: fail what is in flight, go on
                    log.exception("an engine step failed outside any one request")
                    events = []
                    for t in list(self._tickets.values()):
                        self._abort(t, out, "done")
                for ev in events:
                    self._on_event(ev, out)
            self._waiting = engine.num_waiting
            self._running = engine.num_running
            self.metrics.observe_engine(engine)
            self._deliver(out)
        for t in list(self._tickets.values()):  # shutting down: stop what is left
            self._abort(t, [], "done")
        if self.step_log is not None:
            self.step_log.close()

    def _next_deadline(self) -> float | None:
        if not self._tickets:
            return None
        soonest = min(t.deadline for t in self._tickets.values())
        return max(0.0, soonest - time.perf_counter())

    def _expire_due(self) -> bool:
        now = time.perf_counter()
        return any(t.deadline <= now for t in self._tickets.values())

    def _add(self, t: Ticket, out: list[tuple[Ticket, Update]]) -> None:
        engine = self.engine
        try:
            ids = engine.encode(t.prompt)
            room = self.max_model_len - len(ids)
            if t.max_tokens is None:  # fill the context, as far as the pool allows
                max_tokens = max(1, min(room, engine.kv.pool_tokens - len(ids)))
            else:
                max_tokens = t.max_tokens
                engine.check_context(len(ids), max_tokens)
            rid = engine.add_request(ids, t.make_params(max_tokens), t.salt)
        except CtxlabError as exc:
            out.append((t, Update("refused", t.index, message=str(exc))))
            t.finished = True
            return
        except Exception as exc:  # the engine failed on this request alone
            log.exception("adding a request failed")
            msg = f"the server failed to add this request ({type(exc).__name__}: {exc})"
            out.append((t, Update("refused", t.index, message=msg, user_fault=False)))
            t.finished = True
            return
        # The request arrived when the handler submitted it, not when this thread got to it
        # (after the step that was running): TTFT and latency count that wait, as vLLM does.
        engine.seqs[rid].metrics.arrival_time = t.arrival
        t.rid = rid
        t.prompt_tokens = len(ids)
        self._tickets[rid] = t
        self.metrics.prompt_tokens.inc(len(ids))
        out.append((t, Update("admitted", t.index)))

    def _on_event(self, ev: TokenEvent, out: list[tuple[Ticket, Update]]) -> None:
        t = self._tickets.get(ev.request_id)
        if t is None:
            return
        if ev.token_id >= 0:
            self.metrics.generation_tokens.inc()
        if not ev.finished:
            if ev.text_delta:
                seq = self.engine.seqs.get(ev.request_id)
                made = seq.num_tokens - seq.num_prompt if seq is not None else 0
                out.append(
                    (t, Update("token", t.index, text=ev.text_delta, completion_tokens=made))
                )
            return
        self._finish(t, ev.output, ev.text_delta, "done", out)

    def _finish(
        self,
        t: Ticket,
        output: RequestOutput | None,
        text: str,
        kind: UpdateKind,
        out: list[tuple[Ticket, Update]],
    ) -> None:
        assert t.rid is not None
        seq = self.engine.seqs.pop(t.rid, None)
        self._tickets.pop(t.rid, None)
        t.finished = True
        if output is not None and seq is not None:
            self.metrics.observe_finished(output, seq, self.engine)
        out.append((t, Update(kind, t.index, text=text, output=output)))

    def _abort(self, t: Ticket, out: list[tuple[Ticket, Update]], kind: UpdateKind) -> None:
        if t.finished or t.rid is None:
            t.finished = True
            return
        output = self.engine.abort(t.rid)
        self._finish(t, output, "", kind, out)

    def _expire(self, out: list[tuple[Ticket, Update]]) -> None:
        now = time.perf_counter()
        for t in [t for t in self._tickets.values() if t.deadline <= now]:
            self._abort(t, out, "timeout")

    def _deliver(self, out: list[tuple[Ticket, Update]]) -> None:
        if out and self._aloop is not None and not self._aloop.is_closed():
            self._aloop.call_soon_threadsafe(_put_all, out)


def _put_all(out: list[tuple[Ticket, Update]]) -> None:
    for t, upd in out:
        t.queue.put_nowait(upd)
