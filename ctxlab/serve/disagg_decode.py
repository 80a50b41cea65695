"""The decode process's engine: prompts are prefilled elsewhere and their KV arrives by page.

`DecodeEngine` stands where the serve loop expects an `LLMEngine` (everything it does not
define is the local engine's), so the HTTP front, its metrics and its error handling are the
colocated server's: a client sees one endpoint. For a prompt of L tokens it reserves blocks
for the first `floor((L - 1) / page)` pages in the local pool, asks the prefill process for
them, and a receiver thread writes each page into those blocks as it arrives (checked by
crc32). When the last page is in, the request joins the running batch with those tokens
computed; the local engine computes the short tail (at most one page) and samples the first
token, so tokens are those of a colocated server. Short prompts (under one page plus one
token) are computed here.

A failed transfer (a corrupt page, a failure the prefill side reports, the prefill process
gone) fails that request alone with one sentence (`finish_reason` "error", a 500): its
reserved blocks return to the pool, and the prefill side drops its hold on its own blocks.
Once the prefill process is gone, later prompts that need it are refused with the same
sentence; short prompts still run.

`CTXLAB_DISAGG_LOG=FILE` appends one JSON line per finished transfer (bytes, pages,
seconds) for benchmarks; Prometheus counters `{prefix}:kv_transfer_*` carry the totals.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from ctxlab.engine.llm_engine import LLMEngine
from ctxlab.engine.request import Prompt, TokenEvent
from ctxlab.engine.sampling import SamplingParams
from ctxlab.engine.sequence import RequestError, Sequence, Status
from ctxlab.errors import CtxlabError
from ctxlab.serve.disagg_channel import Channel, PeerGone, crc
from ctxlab.serve.disagg_pages import check_movable, layout_key, page_bytes, write_page

log = logging.getLogger(__name__)
LOG_ENV = "CTXLAB_DISAGG_LOG"
WAIT_S = 0.01  # how long an idle step waits for a transfer to finish before returning


class TransferError(RuntimeError):
    """A request's KV could not be moved from the prefill process."""


@dataclass(eq=False)
class _Transfer:
    seq: Sequence
    n_pages: int
    table: Any = None  # torch.Tensor [n_lanes, n_pages]: the reserved blocks
    lock: threading.Lock = field(default_factory=threading.Lock)
    over: bool = False  # done, failed or cancelled: the receiver writes no more pages
    pages_in: int = 0
    t_sent: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0


class DecodeEngine:
    def __init__(self, engine: LLMEngine, channel: Channel, model_id: str):
        check_movable(engine)
        self.engine = engine
        self.ch = channel
        self.block_size = engine.kv.block_size
        self.page_bytes = page_bytes(engine.kv.layout)
        self._handshake(layout_key(engine.kv.layout, model_id))
        self.reserve: deque[_Transfer] = deque()  # waiting for room in the pool
        self.transfers: dict[int, _Transfer] = {}  # pages on their way (receiver reads it)
        self.ready: deque[_Transfer] = deque()  # all pages in, waiting for a running slot
        self._lock = threading.Lock()  # guards `transfers` between the two threads
        self._posted: queue.Queue[tuple[str, int, str]] = queue.Queue()
        self.dead = ""  # why the prefill process is gone, once it is
        self.bytes_moved = 0
        self.seconds_moved = 0.0
        self.num_transfers = 0
        self.num_failed = 0
        self.records: deque[dict] = deque(maxlen=4096)  # the latest transfers, one dict each
        self._counters: dict[str, Any] = {}
        self._log = os.environ.get(LOG_ENV) or None
        self._stats_reply: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._receive, name="ctxlab-kv-recv", daemon=True).start()

    def __getattr__(self, name: str) -> Any:  # everything else is the local engine's
        return getattr(self.engine, name)

    def _handshake(self, key: dict[str, object]) -> None:
        try:
            self.ch.send({"kind": "hello", "layout": key})
            reply, _ = self.ch.recv()
        except PeerGone as exc:
            raise CtxlabError(f"the prefill process did not answer: {exc}.") from None
        if not reply.get("ok"):
            raise CtxlabError(f"the prefill process cannot serve this decode side: {reply}.")

    def attach_metrics(self, registry: CollectorRegistry, prefix: str, model_name: str) -> None:
        for name, doc in (
            ("kv_transfer_bytes", "KV bytes received from the prefill process."),
            ("kv_transfer_seconds", "Seconds from a request's first KV page to its last."),
            ("kv_transfer_requests", "Requests whose KV was received whole."),
            ("kv_transfer_failures", "Requests failed because their KV transfer failed."),
        ):
            c = Counter(f"{prefix}:{name}", doc, ["model_name"], registry=registry)
            self._counters[name] = c.labels(model_name)

    # -- what the serve loop calls --------------------------------------------------------
    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, cache_salt: str | None = None
    ) -> int:
        eng = self.engine
        ids = eng.encode(prompt)
        n_pages = (len(ids) - 1) // self.block_size
        if n_pages == 0:
            return eng.add_request(ids, params, cache_salt)
        if self.dead:
            raise TransferError(self._gone_sentence())
        rid = eng.add_request(ids, params, cache_salt)
        seq = eng.seqs[rid]
        eng.scheduler.waiting.remove(seq)  # it runs once its KV is here
        self.reserve.append(_Transfer(seq, n_pages))
        self._start_reserved()
        return rid

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished() or bool(self.reserve or self.transfers or self.ready)

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting + len(self.reserve) + len(self.transfers) + len(self.ready)

    def step(self, detokenize: bool = False) -> list[TokenEvent]:
        events = self._absorb(block=not self.engine.has_unfinished())
        self._start_reserved()
        if self.engine.has_unfinished():
            events += self.engine.step(detokenize)
        return events

    def abort(self, request_id: int) -> Any:
        for tr in [*self.reserve, *self.ready, self.transfers.get(request_id)]:
            if tr is not None and tr.seq.seq_id == request_id:
                self._drop(tr)
                self._cancel(request_id)
        return self.engine.abort(request_id)  # frees the reserved blocks

    # -- the engine thread's side of a transfer --------------------------------------------
    def _start_reserved(self) -> None:
        """Reserve blocks and send the prompt for every transfer the pool has room for."""
        eng = self.engine
        while self.reserve and not self.dead:
            tr = self.reserve[0]
            if not eng.kv.allocate(tr.seq.kv, tr.n_pages * self.block_size):
                return  # the pool is full: wait for running requests to finish
            self.reserve.popleft()
            tr.table = tr.seq.kv.table[:, : tr.n_pages].clone()
            tr.t_sent = time.perf_counter()
            with self._lock:
                self.transfers[tr.seq.seq_id] = tr
            ids = tr.seq.prompt_ids[: tr.n_pages * self.block_size]
            msg = {"kind": "prefill", "rid": tr.seq.seq_id, "ids": ids, "salt": tr.seq.cache_salt}
            try:
                self.ch.send(msg)
            except PeerGone as exc:
                self._posted.put(("gone", -1, str(exc)))
                return

    def _absorb(self, block: bool) -> list[TokenEvent]:
        posted: list[tuple[str, int, str]] = []
        waiting = bool(self.transfers) and block
        try:
            posted.append(
                self._posted.get(timeout=WAIT_S) if waiting else self._posted.get_nowait()
            )
            while True:
                posted.append(self._posted.get_nowait())
        except queue.Empty:
            pass
        events: list[TokenEvent] = []
        for kind, rid, message in posted:
            if kind == "done":
                self._arrived(rid)
            elif kind == "fail":
                tr = self.transfers.get(rid)
                if tr is not None:
                    self._drop(tr)
                    events.append(self._fail(tr.seq, message))
            else:  # the prefill process is gone: everything waiting on it fails
                self.dead = self.dead or message
                for tr in [*self.reserve, *self.transfers.values()]:
                    self._drop(tr)
                    events.append(self._fail(tr.seq, self._gone_sentence()))
        sched = self.engine.scheduler
        while self.ready and len(sched.running) < sched.max_num_seqs:
            self._admit(self.ready.popleft())
        return events

    def _arrived(self, rid: int) -> None:
        tr = self.transfers.get(rid)
        if tr is None:
            return
        self._drop(tr)
        nbytes = tr.n_pages * self.page_bytes
        seconds = tr.t_last - tr.t_first
        self.bytes_moved += nbytes
        self.seconds_moved += seconds
        self.num_transfers += 1
        if self._counters:
            self._counters["kv_transfer_bytes"].inc(nbytes)
            self._counters["kv_transfer_seconds"].inc(seconds)
            self._counters["kv_transfer_requests"].inc()
        row = {
            "rid": rid,
            "pages": tr.n_pages,
            "bytes": nbytes,
            "transfer_s": seconds,
            "request_to_last_page_s": tr.t_last - tr.t_sent,
        }
        self.records.append(row)
        if self._log:
            with open(self._log, "a") as f:
                f.write(json.dumps(row) + "\n")
        self.ready.append(tr)

    def _admit(self, tr: _Transfer) -> None:
        """The pages are in: the request runs with them as computed tokens."""
        eng, seq = self.engine, tr.seq
        n = tr.n_pages * self.block_size
        eng.kv.advance(seq.kv, n)
        eng.kv.commit(seq.kv, seq.token_ids, seq.cache_salt)
        seq.num_computed = n
        seq.admitted = True
        seq.status = Status.RUNNING
        eng.scheduler.running.append(seq)

    def _drop(self, tr: _Transfer) -> None:
        """The receiver writes no more pages of `tr`; it leaves every queue."""
        with tr.lock:
            tr.over = True
        with self._lock:
            self.transfers.pop(tr.seq.seq_id, None)
        for q in (self.reserve, self.ready):
            if tr in q:
                q.remove(tr)

    def _fail(self, seq: Sequence, message: str) -> TokenEvent:
        """Finish `seq` with an error; its blocks go back to the pool."""
        eng = self.engine
        self.num_failed += 1
        if self._counters:
            self._counters["kv_transfer_failures"].inc()
        seq.error = RequestError(message, False)
        eng.scheduler.finish(seq, "error")
        eng.runtime.release(seq.seq_id)
        seq.metrics.finish_time = time.perf_counter()
        return TokenEvent(seq.seq_id, -1, "", True, eng.output(seq.seq_id))

    def _cancel(self, rid: int) -> None:
        with contextlib.suppress(PeerGone):
            self.ch.send({"kind": "cancel", "rid": rid})

    def _gone_sentence(self) -> str:
        return (
            f"the prefill process is gone ({self.dead}), so this prompt's KV cannot be computed; "
            "restart the server."
        )

    def prefill_stats(self, timeout: float = 10.0) -> dict:
        """The prefill process's pool counters (blocks in use), asked over the channel."""
        self.ch.send({"kind": "stats"})
        return self._stats_reply.get(timeout=timeout)

    # -- the receiver thread --------------------------------------------------------------
    def _receive(self) -> None:
        pool = self.engine.kv.pool
        while True:
            try:
                header, payload = self.ch.recv()
            except (PeerGone, ValueError) as exc:
                self._posted.put(("gone", -1, str(exc)))
                return
            kind = header.get("kind")
            rid = int(header.get("rid", -1))
            if kind == "stats":
                self._stats_reply.put(header)
                continue
            with self._lock:
                tr = self.transfers.get(rid)
            if tr is None:
                continue
            if kind == "fail":
                self._posted.put(("fail", rid, f"the prefill process failed: {header['message']}"))
                continue
            with tr.lock:
                if tr.over:
                    continue
                if kind == "done":
                    if tr.pages_in != tr.n_pages:
                        why = f"{tr.pages_in} of {tr.n_pages} KV pages arrived"
                        self._posted.put(("fail", rid, f"the KV transfer was incomplete: {why}"))
                    else:
                        self._posted.put(("done", rid, ""))
                    tr.over = True
                    continue
                page = int(header.get("page", -1))
                bad = self._check_page(tr, page, header, payload)
                if bad:
                    tr.over = True
                    self._posted.put(("fail", rid, f"the KV transfer failed: {bad}"))
                    self._cancel(rid)
                    continue
                now = time.perf_counter()
                if tr.pages_in == 0:
                    tr.t_first = now
                write_page(pool, tr.table, page, payload)
                tr.pages_in += 1
                tr.t_last = time.perf_counter()

    def _check_page(self, tr: _Transfer, page: int, header: dict, payload: bytearray) -> str:
        if page != tr.pages_in:
            return f"page {page} arrived where page {tr.pages_in} was due"
        if len(payload) != self.page_bytes:
            return f"page {page} has {len(payload)} bytes, not {self.page_bytes}"
        if crc(payload) != header.get("crc"):
            return f"page {page} arrived corrupted (checksum mismatch)"
        return ""
