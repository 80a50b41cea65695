"""One bounded queue of KV transfers and the worker thread that runs them, in order.

The prefix cache's offload tier moves blocks both ways through here: stores (pool -> host
memory -> disk) and restores (back). One worker and FIFO order are the point: a restore
queued behind stores waits for them, as it would behind a busy PCIe link or disk, and that
wait is measured (`waits`, per direction) rather than hidden. The queue is bounded, so a
burst of evictions holds the engine back instead of piling snapshots up without limit; the
time a producer spends blocked on a full queue is measured too.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

# Directions a transfer is counted under (vLLM's offloading connector: store = device to
# host, load = host to device).
STORE, LOAD = "store", "load"


class TransferQueue:
    """FIFO of callables run by one daemon thread; `submit` returns a future."""

    def __init__(self, maxsize: int = 64):
        self._q: queue.Queue[tuple[Callable[[], object], Future, str, float] | None] = queue.Queue(
            maxsize=maxsize
        )
        self.maxsize = maxsize
        self.waits: dict[str, list[float]] = {STORE: [], LOAD: []}  # queued -> started, s
        self.busy: dict[str, float] = {STORE: 0.0, LOAD: 0.0}  # seconds the worker ran them
        self.blocked_s = 0.0  # producers blocked on a full queue
        self._worker = threading.Thread(target=self._run, name="ctxlab-kv-transfer", daemon=True)
        self._worker.start()

    def submit(self, fn: Callable[[], T], direction: str) -> Future[T]:
        fut: Future[T] = Future()
        t0 = time.perf_counter()
        self._q.put((fn, fut, direction, t0))  # blocks while the queue is full
        self.blocked_s += time.perf_counter() - t0
        return fut

    def drain(self) -> None:
        """Wait until every transfer queued so far has run."""
        self.submit(lambda: None, STORE).result()
        self.waits[STORE].pop()  # the marker is not a transfer

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, fut, direction, queued = item
            start = time.perf_counter()
            self.waits[direction].append(start - queued)
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the waiter, who decides
                fut.set_exception(exc)
            self.busy[direction] += time.perf_counter() - start

    def close(self) -> None:
        """Run what is queued, then stop the worker."""
        if self._worker.is_alive():
            self._q.put(None)
            self._worker.join()
