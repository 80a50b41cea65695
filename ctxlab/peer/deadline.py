"""A total deadline for one request to a server.

httpx's timeouts are per phase (connect, then each read), so a server that trickles one
byte at a time, or streams keep-alive comments forever, never trips them, and a server that
accepts and never answers holds a request for the whole read timeout. A request made here
is bounded in total: the wait for the headers by a read timeout no longer than the time
left, the body by a wall-clock check after every chunk that arrives (a keep-alive or a
single trickled byte is a chunk), and a silent body by a watchdog that shuts the
connection's socket when the time is up, so a blocked read returns at once. Async callers
(`bench serve`) bound the whole request with `asyncio.timeout(deadline.left())` instead.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

CONNECT_S = 10.0  # seconds to open a connection (never more than the deadline)


class DeadlinePassed(httpx.TimeoutException):
    """A request took longer in total than its deadline (an httpx timeout, so code that
    handles a server that stopped answering handles this too)."""


@dataclass
class Deadline:
    """`seconds` in total from `start` (monotonic clock) for one request."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def message(self) -> str:
        return f"no complete answer within the total deadline of {self.seconds:g} s"

    def check(self) -> None:
        if self.left() <= 0:
            raise DeadlinePassed(self.message())

    def timeout(self, connect: float = CONNECT_S) -> httpx.Timeout:
        """httpx's per-phase timeouts, none longer than the time left."""
        left = max(0.001, self.left())
        return httpx.Timeout(left, connect=min(connect, left))


@contextlib.contextmanager
def stream(
    client: httpx.Client, method: str, url: str, deadline: Deadline, **kwargs: Any
) -> Iterator[httpx.Response]:
    """`client.stream(...)` within `deadline`; read its body with `lines` or `chunks`."""
    try:
        opened = client.stream(method, url, timeout=deadline.timeout(), **kwargs)
        response = opened.__enter__()
    except httpx.TimeoutException as exc:
        # every phase's timeout is the time left: only a connect timeout shorter than the
        # deadline is the server's own fault (unreachable), anything else is the deadline
        if isinstance(exc, httpx.ConnectTimeout) and deadline.left() > 0:
            raise
        raise DeadlinePassed(deadline.message()) from None
    watchdog = _watchdog(response, deadline)
    try:
        yield response
    except httpx.TransportError:
        if deadline.left() <= 0:  # the watchdog cut the socket, or a read timed out
            raise DeadlinePassed(deadline.message()) from None
        raise
    finally:
        if watchdog is not None:
            watchdog.cancel()
        opened.__exit__(None, None, None)


def chunks(response: httpx.Response, deadline: Deadline) -> Iterator[bytes]:
    """The body as it arrives, the deadline checked after every chunk."""
    for chunk in response.iter_bytes():
        deadline.check()
        yield chunk


def lines(response: httpx.Response, deadline: Deadline) -> Iterator[str]:
    """The body's lines (without line ends) as they arrive, within the deadline."""
    pending = ""
    for piece in response.iter_text():
        deadline.check()
        pending += piece
        *done, pending = pending.split("\n")
        for line in done:
            yield line.rstrip("\r")
    if pending:
        yield pending.rstrip("\r")


@dataclass(frozen=True)
class Reply:
    """A whole (non-streamed) answer: its status and body."""

    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


def request(
    client: httpx.Client, method: str, url: str, deadline: Deadline, **kwargs: Any
) -> Reply:
    """One request whose whole answer is read within `deadline`."""
    with stream(client, method, url, deadline, **kwargs) as response:
        body = b"".join(chunks(response, deadline))
        return Reply(response.status_code, body)


def _watchdog(response: httpx.Response, deadline: Deadline) -> threading.Timer | None:
    """A timer that shuts the response's socket when the deadline passes (no-op once the
    response is closed, so a connection back in the pool is never touched)."""
    net = response.extensions.get("network_stream")
    sock = net.get_extra_info("socket") if net is not None else None
    if not isinstance(sock, socket.socket):
        return None  # no socket (a test transport): the per-chunk check still bounds it

    def cut() -> None:
        if not response.is_closed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(max(0.0, deadline.left()), cut)
    timer.daemon = True
    timer.start()
    return timer
