"""`ctxlab probe --kv-events`: listen to the server's KV events for the whole probe.

A `Subscriber` (ctxlab.kvevents) is polled by one background thread from before the first
request to after the last, so the capacity section's fill is seen block by block. From the
events the capacity is confirmed independently of cached-token counts: the first removal of
a block stored while the probe listened says the pool was full (removals of blocks stored
before the probe began come first, an LRU free queue hands out the oldest, and are counted
apart), and the most blocks cached at once is the pool: at that first removal the request
that asked for blocks already holds some not yet stored, so its count is a lower bound.
A silent endpoint never holds the probe up: the thread polls in short slices and is joined
with a bound; the figure then says no events arrived.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ctxlab.kvevents.events import msgpack_module
from ctxlab.kvevents.residency import Residency
from ctxlab.kvevents.subscriber import Subscriber, check_loopback, zmq_module
from ctxlab.probe.figures import Figure

NAME = "capacity from KV events"
POLL_S = 0.2
JOIN_S = 5.0


def check_endpoint(endpoint: str, flag: str = "--kv-events") -> str:
    """Loopback or ipc only, and the packages present: one sentence otherwise."""
    check_loopback(endpoint, flag)
    msgpack_module()
    zmq_module()
    return endpoint


class EventListener:
    """Reads KV-event batches in a background thread until `stop`."""

    def __init__(self, endpoint: str, max_events: int = 200_000):
        self.endpoint = check_endpoint(endpoint)
        self._sub = Subscriber(endpoint, max_events=max_events)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kv-events", daemon=True)
        self.started = 0.0
        self.seconds = 0.0
        self.error = ""

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._sub.poll(POLL_S)
        except Exception as exc:  # a broken socket ends listening, never the probe
            self.error = f"{type(exc).__name__}: {exc}"

    def start(self) -> EventListener:
        self.started = time.time()
        self._thread.start()
        return self

    def stop(self, settle_s: float = 1.0) -> Residency:
        """Give the publisher `settle_s` to flush its last batch, stop, and read what came."""
        time.sleep(settle_s)
        self._stop.set()
        self._thread.join(JOIN_S)
        self.seconds = time.time() - self.started
        batches = [r.batch for r in self._sub.batches]
        if not self._thread.is_alive():
            self._sub.close()
        return Residency(max_records=self._sub.max_events).feed_all(batches)

    @property
    def subscriber(self) -> Subscriber:
        return self._sub


@dataclass(frozen=True)
class EventCapacity:
    figure: Figure
    tokens: int | None


def capacity(res: Residency, listener: EventListener, published: int | None) -> EventCapacity:
    """The pool as the events show it, once a removal of a block the probe saw stored says
    it was full: the most blocks cached at once."""
    sub = listener.subscriber
    if sub.received_batches == 0:
        why = (
            f"no KV events arrived from {listener.endpoint} in the {listener.seconds:.0f} s of "
            "the probe: is a publisher there (vLLM: --kv-events-config with publisher zmq; "
            "ctxlab serve: --kv-events-endpoint)?"
        )
        if listener.error:
            why = f"listening to {listener.endpoint} failed ({listener.error})"
        return EventCapacity(Figure(NAME, None, "not measurable", why), None)
    first = next((e for e in res.evictions if e.lifetime_s is not None), None)
    older = sum(1 for e in res.evictions if e.lifetime_s is None)
    gaps = sum(g.missing for g in sub.gaps)
    tail = (
        f"; {sub.received_batches:,} batches, {res.stored_total:,} blocks stored, "
        f"{len(res.evictions):,} removed"
        + (f", {gaps} batches missed (sequence gaps)" if gaps else "")
    )
    if first is None or not res.block_size:
        return EventCapacity(
            Figure(
                NAME, None, "not measurable",
                "no block stored during the probe was removed: the probe did not fill the "
                f"pool (run the capacity section){tail}",
            ),
            None,
        )  # fmt: skip
    tokens = res.peak_resident * res.block_size
    vs = ""
    if published is not None:
        off = tokens - published
        vs = f"; the published {published:,} tokens " + (
            "confirmed within one block" if abs(off) <= res.block_size else f"{off:+,} off"
        )
    note = (
        f"the pool was full when a block stored during the probe was first removed "
        f"({first.resident_before:,} blocks cached then; a request's blocks are taken before "
        f"they are stored"
        + (f"; {older:,} blocks from before the probe went first" if older else "")
        + f"); the most cached at once: {res.peak_resident:,} blocks of {res.block_size} tokens"
        + vs
        + tail
    )
    return EventCapacity(Figure(NAME, tokens, "measured", note, "tokens"), tokens)
