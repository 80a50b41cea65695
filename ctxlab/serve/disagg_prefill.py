"""The prefill process: computes prompts' KV and sends it, page by page, to a decode process.

`ctxlab serve --role prefill` runs `PrefillWorker.serve_forever`: it listens on the KV
socket, takes one decode process at a time, and for every `prefill` message runs the token
ids through its own `LLMEngine` (continuous batching and chunked prefill as usual). When the
prompt's last chunk is computed, the request's full blocks are held (one extra reference
each), the request leaves the engine, and a sender thread streams the pages; the hold is
dropped on the engine thread once the pages are sent, the send failed, or the decode side
cancelled, so every block returns to the pool whatever happens. With prefix caching on, the
sent blocks stay findable: a later prompt with the same prefix is computed once.

The decode side asks only for whole pages of the prompt minus its last token: it computes
the tail itself, so the first token is sampled where the rest are, with the request's own
sampling state, and the tokens are those of a colocated server.

Fault injection for tests (`CTXLAB_DISAGG_FAULT=KIND:N[,KIND:N...]`, N counts this
process's prefill requests from 1): `corrupt` flips a byte of the first page after its
checksum, `fail` sends a failure after the first page, `die` ends the process after the
first page.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field

from ctxlab.engine.llm_engine import LLMEngine
from ctxlab.engine.sampling import SamplingParams
from ctxlab.errors import CtxlabError
from ctxlab.serve.disagg_channel import Channel, PeerGone, crc, listen
from ctxlab.serve.disagg_pages import check_movable, layout_key, read_page

log = logging.getLogger(__name__)
FAULT_ENV = "CTXLAB_DISAGG_FAULT"
FAULT_KINDS = ("corrupt", "fail", "die")
BURST_S = 0.002  # after an idle wait, how long to let the rest of a burst of prompts arrive


@dataclass(frozen=True)
class Fault:
    kind: str
    at: int  # the n-th prefill request (from 1)

    @classmethod
    def from_env(cls) -> dict[int, Fault]:
        """KIND:N[,KIND:N...] -> the fault of each request number."""
        out: dict[int, Fault] = {}
        for raw in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
            kind, _, at = raw.partition(":")
            if kind not in FAULT_KINDS or not at.isdigit():
                raise CtxlabError(
                    f"{FAULT_ENV} item {raw!r} is not KIND:N with KIND in {FAULT_KINDS}."
                )
            out[int(at)] = cls(kind, int(at))
        return out


@dataclass(eq=False)
class _Job:
    """One request's pages to send; `blocks` are held until the sender is done with them."""

    rid: int
    number: int  # which prefill request of this process (for fault injection)
    table: object  # torch.Tensor [n_lanes, n_pages] of held physical blocks
    n_pages: int
    compute_s: float
    cancelled: bool = False
    blocks: list[int] = field(default_factory=list)


class PrefillWorker:
    def __init__(self, engine: LLMEngine, address: str, model_id: str):
        check_movable(engine)
        self.engine = engine
        self.address = address
        self.key = layout_key(engine.kv.layout, model_id)
        self.faults = Fault.from_env()
        self.count = 0  # prefill requests taken since start

    def serve_forever(self, on_ready: object = None) -> None:
        listener = listen(self.address)
        if callable(on_ready):
            on_ready()
        while True:
            sock, _ = listener.accept()
            self._serve(Channel(sock))

    # -- one decode connection ------------------------------------------------------------
    def _serve(self, ch: Channel) -> None:
        eng = self.engine
        inbox: queue.Queue[tuple[str, dict]] = queue.Queue()
        jobs: queue.Queue[_Job | None] = queue.Queue()
        reader = threading.Thread(target=_read_loop, args=(ch, inbox), daemon=True)
        reader.start()
        sender = threading.Thread(target=self._send_loop, args=(ch, jobs, inbox), daemon=True)
        sender.start()
        computing: dict[int, tuple[int, int, float]] = {}  # engine rid -> (rid, number, t0)
        sending: dict[int, _Job] = {}
        held = 0
        gone = ""
        while not gone:
            idle = not eng.has_unfinished()
            batch: list[tuple[str, dict]] = []
            try:
                batch.append(inbox.get(timeout=0.5) if idle else inbox.get_nowait())
                if idle:  # prompts sent together are computed together, not one step apart
                    time.sleep(BURST_S)
                while True:
                    batch.append(inbox.get_nowait())
            except queue.Empty:
                pass
            for kind, msg in batch:
                if kind == "gone":
                    gone = msg.get("reason", "gone")
                elif kind == "release":
                    job = sending.pop(msg["rid"], None)
                    if job is not None:
                        eng.kv.alloc.decref(job.blocks)
                        held -= len(job.blocks)
                else:
                    self._on_message(ch, msg, computing, sending)
            if gone or not eng.has_unfinished():
                continue
            for ev in eng.step():
                if ev.request_id not in computing:
                    continue
                rid, number, t0 = computing.pop(ev.request_id)
                if ev.finished:  # an error inside the step: this request alone
                    eng.seqs.pop(ev.request_id, None)
                    err = ev.output.error if ev.output is not None else None
                    why = err.message if err is not None else "the prefill step failed"
                    _try_send(ch, {"kind": "fail", "rid": rid, "message": why})
                    continue
                job = self._hold(ev.request_id, rid, number, time.perf_counter() - t0)
                held += len(job.blocks)
                sending[rid] = job
                jobs.put(job)
        # The decode side went away: stop what is computing, let the sender drop the rest.
        dropped = len(computing) + len(sending)
        for prid in list(computing):
            eng.abort(prid)
            eng.seqs.pop(prid, None)
        for job in sending.values():
            job.cancelled = True
        jobs.put(None)
        sender.join()
        while not inbox.empty():
            kind, msg = inbox.get_nowait()
            job = sending.pop(msg.get("rid", -1), None) if kind == "release" else None
            if job is not None:
                eng.kv.alloc.decref(job.blocks)
        ch.close()
        st = eng.stats()
        print(
            f"prefill: the decode process went away ({gone}); {dropped} requests in flight "
            f"dropped; blocks in use {st.blocks_used} of {st.blocks_total}",
            file=sys.stderr,
            flush=True,
        )

    def _on_message(
        self,
        ch: Channel,
        msg: dict,
        computing: dict[int, tuple[int, int, float]],
        sending: dict[int, _Job],
    ) -> None:
        eng = self.engine
        kind = msg.get("kind")
        if kind == "hello":
            theirs = msg.get("layout")
            ok = theirs == self.key
            why = "" if ok else f"the prefill process runs {self.key}, the decode side {theirs}"
            _try_send(ch, {"kind": "hello", "ok": ok, "message": why, "layout": self.key})
        elif kind == "prefill":
            self.count += 1
            rid = int(msg["rid"])
            params = SamplingParams(max_tokens=2, ignore_eos=True)
            try:
                prid = eng.add_request(list(msg["ids"]), params, msg.get("salt"))
            except CtxlabError as exc:
                _try_send(ch, {"kind": "fail", "rid": rid, "message": str(exc)})
                return
            computing[prid] = (rid, self.count, time.perf_counter())
        elif kind == "cancel":
            rid = int(msg["rid"])
            for prid, (r, _, _) in list(computing.items()):
                if r == rid:
                    eng.abort(prid)
                    eng.seqs.pop(prid, None)
                    del computing[prid]
            if rid in sending:
                sending[rid].cancelled = True
        elif kind == "stats":
            st = eng.stats()
            _try_send(
                ch,
                {
                    "kind": "stats",
                    "blocks_used": st.blocks_used,
                    "blocks_total": st.blocks_total,
                    "computing": len(computing),
                    "sending": len(sending),
                },
            )

    def _hold(self, prid: int, rid: int, number: int, compute_s: float) -> _Job:
        """Take an extra reference on the request's full blocks, then end the request."""
        eng = self.engine
        seq = eng.seqs[prid]
        n_pages = seq.num_prompt // eng.kv.block_size
        table = seq.kv.table[:, :n_pages].clone()
        blocks = table.flatten().tolist()
        eng.kv.alloc.incref(blocks)
        eng.abort(prid)
        eng.seqs.pop(prid, None)
        return _Job(rid, number, table, n_pages, compute_s, blocks=blocks)

    # -- the sender thread ----------------------------------------------------------------
    def _send_loop(self, ch: Channel, jobs: queue.Queue, inbox: queue.Queue) -> None:
        pool = self.engine.kv.pool
        while (job := jobs.get()) is not None:
            try:
                t0 = time.perf_counter()
                for page in range(job.n_pages):
                    if job.cancelled:
                        break
                    payload = read_page(pool, job.table, page)
                    check = crc(payload)
                    fault = self.faults.get(job.number)
                    if fault is not None and fault.kind == "corrupt" and page == 0:
                        payload = bytes([payload[0] ^ 0xFF]) + payload[1:]
                    ch.send({"kind": "page", "rid": job.rid, "page": page, "crc": check}, payload)
                    if fault is not None and fault.kind == "die":
                        os._exit(3)
                    if fault is not None and fault.kind == "fail":
                        raise OSError("injected fault: the prefill side failed while sending")
                else:
                    ch.send(
                        {
                            "kind": "done",
                            "rid": job.rid,
                            "pages": job.n_pages,
                            "compute_s": job.compute_s,
                            "send_s": time.perf_counter() - t0,
                        }
                    )
            except PeerGone:
                job.cancelled = True
            except OSError as exc:
                _try_send(ch, {"kind": "fail", "rid": job.rid, "message": str(exc)})
            finally:
                inbox.put(("release", {"rid": job.rid}))


def _read_loop(ch: Channel, inbox: queue.Queue) -> None:
    while True:
        try:
            header, _ = ch.recv()
        except (PeerGone, ValueError) as exc:
            inbox.put(("gone", {"reason": str(exc)}))
            return
        inbox.put(("msg", header))


def _try_send(ch: Channel, header: dict) -> None:
    with contextlib.suppress(PeerGone):  # the reader sees the same and ends the connection
        ch.send(header)
