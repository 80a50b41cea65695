"""Publish KV events in vLLM's format (`ctxlab serve --kv-events-endpoint`).

The engine's thread tells the publisher what the prefix cache stored and removed (it
implements `ctxlab.kv.block_events.BlockEvents`); a thread of its own owns the ZMQ
sockets (a socket is not thread-safe), sends each batch as [topic, seq, msgpack] on a PUB
socket, keeps the last `buffer_batches` for a replay ROUTER socket, and answers replay
requests as vLLM's `ZmqEventPublisher` does. Both sockets bind on loopback only.

ctxlab's block hashes are 16-byte blake2b digests; they are published as ints (their low 64
bits, as vLLM publishes sha256 hashes by default), so a router that speaks vLLM's format
reads them unchanged. The tenant's `cache_salt` goes in the first block's `extra_keys`,
where vLLM puts it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

from ctxlab.kvevents.events import (
    END_SEQ,
    BlockId,
    BlockRemoved,
    BlockStored,
    Event,
    encode_payload,
)
from ctxlab.kvevents.subscriber import check_loopback, zmq_module

MEDIUM = "GPU"  # vLLM's name for the engine's own pool (it says GPU on its CPU build too)


def block_id(h: bytes) -> int:
    """A ctxlab block hash as the int vLLM publishes: its low 64 bits."""
    return int.from_bytes(h, "big") & ((1 << 64) - 1)


class EventPublisher:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_batches: int = 10_000,
        max_queue: int = 100_000,
    ):
        self.endpoint = check_loopback(endpoint, "--kv-events-endpoint")
        self.replay_endpoint = (
            None
            if replay_endpoint is None
            else check_loopback(replay_endpoint, "--kv-events-replay-endpoint")
        )
        self.topic = topic.encode("utf-8")
        self._queue: queue.Queue[Event | None] = queue.Queue(maxsize=max_queue)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_batches)
        self.published_batches = 0
        self.dropped_events = 0  # the queue was full: the engine never waits on a reader
        zmq = zmq_module()
        ctx = zmq.Context.instance()
        self._pub = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay = None
        try:
            self._pub.bind(self.endpoint)
            if self.replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(self.replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            from ctxlab.errors import CtxlabError

            raise CtxlabError(f"cannot publish KV events there: {exc.strerror}.") from None
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="kv-events", daemon=True)
        self._thread.start()

    # -- BlockEvents (called on the engine's thread) -----------------------------------
    def stored(
        self,
        hashes: Sequence[bytes],
        parent: bytes | None,
        token_ids: Sequence[int],
        block_size: int,
        salt: str | None,
    ) -> None:
        extra: tuple[tuple[object, ...] | None, ...] | None = None
        if salt is not None and parent is None:
            extra = ((salt,), *([None] * (len(hashes) - 1)))
        ids: tuple[BlockId, ...] = tuple(block_id(h) for h in hashes)
        self._put(
            BlockStored(
                ids,
                None if parent is None else block_id(parent),
                tuple(int(t) for t in token_ids),
                block_size,
                MEDIUM,
                extra_keys=extra,
            )
        )

    def removed(self, hashes: Sequence[bytes]) -> None:
        self._put(BlockRemoved(tuple(block_id(h) for h in hashes), MEDIUM))

    def _put(self, event: Event) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped_events += 1

    # -- the sockets' thread ------------------------------------------------------------
    def _loop(self) -> None:
        seq = 0
        while self._running or not self._queue.empty():
            self._serve_replay()
            try:
                first = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            events: list[Event] = []
            item: Event | None = first
            while item is not None:
                events.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if events:
                payload = encode_payload(time.time(), events, 0)
                self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
                self._buffer.append((seq, payload))
                self.published_batches += 1
                seq += 1
            if item is None:
                break

    def _serve_replay(self) -> None:
        if self._replay is None:
            return
        zmq = zmq_module()
        while self._replay.poll(0, zmq.POLLIN):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    self._replay.send_multipart(
                        [client, b"", self.topic, seq.to_bytes(8, "big"), payload]
                    )
            end = END_SEQ.to_bytes(8, "big", signed=True)
            self._replay.send_multipart([client, b"", b"", end, b""])

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued, then close the sockets."""
        self._running = False
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout=timeout_s)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
