"""A bounded reader of a KV-event stream: a ZMQ SUB socket, gap detection, replay.

It connects (never binds) to a publisher on this machine: vLLM's `--kv-events-config`
endpoint or `ctxlab serve --kv-events-endpoint`. Batches are numbered; a number that skips
ahead is a gap (the PUB socket drops when a reader lags, or the reader came late), recorded
as a `Gap`, and, when the publisher has a replay socket, the missing batches are asked for
(vLLM's ROUTER protocol: the first wanted number as 8 big-endian bytes; the answer is the
buffered batches from there, then an empty message numbered -1). Memory is bounded: at most
`max_events` events are kept, the oldest batches go first and are counted as dropped.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

from ctxlab.errors import CtxlabError
from ctxlab.kvevents.events import END_SEQ, EventBatch, decode_frames

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def check_loopback(endpoint: str, flag: str = "the endpoint") -> str:
    """`endpoint` if it is tcp:// on loopback or ipc://; else one clear sentence."""
    if endpoint.startswith("ipc://"):
        return endpoint
    if not endpoint.startswith("tcp://"):
        raise CtxlabError(f"{flag} {endpoint!r} is not tcp://127.0.0.1:PORT or ipc://PATH.")
    parts = urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.hostname not in LOOPBACK or port is None:
        raise CtxlabError(
            f"{flag} {endpoint!r} is not on this machine's loopback; "
            "give tcp://127.0.0.1:PORT (ctxlab uses no other network)."
        )
    return endpoint


def zmq_module():
    try:
        import zmq
    except ImportError:
        raise CtxlabError(
            "KV events need the pyzmq package: pip install 'ctxlab[events]'."
        ) from None
    return zmq


@dataclass(frozen=True)
class Gap:
    """Batches `first`..`last` never arrived on the live socket."""

    first: int
    last: int
    replayed: int = 0  # how many of them the replay socket sent back

    @property
    def missing(self) -> int:
        return self.last - self.first + 1 - self.replayed


@dataclass(frozen=True)
class Received:
    """A batch and when this reader got it (its own wall clock)."""

    at: float
    batch: EventBatch


class Subscriber:
    def __init__(
        self,
        endpoint: str,
        topic: str = "",
        replay_endpoint: str | None = None,
        max_events: int = 200_000,
        expect_from: int | None = None,
    ):
        """`expect_from`: the first batch number wanted (0: everything the publisher sent,
        so a late start is a gap the replay socket can fill); None takes the stream as it
        comes."""
        if max_events < 1:
            raise CtxlabError(f"max_events must be at least 1, got {max_events}.")
        self.endpoint = check_loopback(endpoint)
        self.replay_endpoint = (
            None
            if replay_endpoint is None
            else check_loopback(replay_endpoint, "the replay endpoint")
        )
        self.topic = topic
        self.max_events = max_events
        self.batches: deque[Received] = deque()
        self.gaps: list[Gap] = []
        self.n_events = 0  # events held now
        self.dropped_events = 0  # events let go to stay within max_events
        self.received_batches = 0
        self.unknown_events = 0
        self.bad_messages = 0  # messages that were not a batch (skipped)
        self.last_seq: int | None = None if expect_from is None else expect_from - 1
        zmq = zmq_module()
        self._ctx = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        self._sub.connect(self.endpoint)

    # -- reading ----------------------------------------------------------------------
    def poll(self, timeout_s: float) -> int:
        """Read every batch that arrives within `timeout_s` seconds; how many arrived."""
        zmq = zmq_module()
        end = time.monotonic() + max(0.0, timeout_s)
        n = 0
        while True:
            left = end - time.monotonic()
            if not self._sub.poll(max(0, int(left * 1000)), zmq.POLLIN):
                return n
            self._take(self._sub.recv_multipart())
            n += 1
            while time.monotonic() < end and self._sub.poll(0, zmq.POLLIN):
                self._take(self._sub.recv_multipart())  # (a fast publisher cannot hold it)
                n += 1
            if time.monotonic() >= end:
                return n

    def catch_up(self) -> int:
        """Ask the replay socket for every batch after the last one held (all it still
        buffers, with `expect_from=0`); how many came back. Without a replay socket, 0."""
        if self.replay_endpoint is None or self.last_seq is None:
            return 0
        return self._replay(self.last_seq + 1, 2**62)

    def _take(self, frames: list[bytes]) -> None:
        try:
            batch = decode_frames(frames)
        except CtxlabError:
            self.bad_messages += 1
            return
        if self.last_seq is not None and batch.seq <= self.last_seq:
            return  # a duplicate (a replay overlapping what arrived live)
        if self.last_seq is not None and batch.seq > self.last_seq + 1:
            first, last = self.last_seq + 1, batch.seq - 1
            replayed = self._replay(first, last)
            self.gaps.append(Gap(first, last, replayed))
        self._keep(batch)

    def _keep(self, batch: EventBatch) -> None:
        self.batches.append(Received(time.time(), batch))
        self.last_seq = batch.seq
        self.received_batches += 1
        self.unknown_events += batch.unknown
        self.n_events += len(batch.events)
        while self.n_events > self.max_events and len(self.batches) > 1:
            old = self.batches.popleft()
            self.n_events -= len(old.batch.events)
            self.dropped_events += len(old.batch.events)

    def _replay(self, first: int, last: int, timeout_s: float = 2.0) -> int:
        """Ask the replay socket for batches first..last; keep those that come back."""
        if self.replay_endpoint is None:
            return 0
        zmq = zmq_module()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        got = 0
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart([b"", first.to_bytes(8, "big")])
            end = time.monotonic() + timeout_s
            while sock.poll(max(0, int((end - time.monotonic()) * 1000)), zmq.POLLIN):
                frames = sock.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) == 3 and int.from_bytes(frames[1], "big", signed=True) == END_SEQ:
                    break
                try:
                    batch = decode_frames(frames)
                except CtxlabError:
                    self.bad_messages += 1
                    continue
                if first <= batch.seq <= last and (
                    self.last_seq is None or batch.seq > self.last_seq
                ):
                    self._keep(batch)
                    got += 1
        finally:
            sock.close()
        return got

    # -- lifetime ---------------------------------------------------------------------
    def close(self) -> None:
        self._sub.close(linger=0)

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
