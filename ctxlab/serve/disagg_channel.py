"""The wire between a prefill process and a decode process: framed messages on a socket.

A message is a 4-byte length, a JSON header of that length, then `header["nbytes"]` payload
bytes (a page of K/V, or nothing). A Unix-domain stream socket carries them by default (a
`host:port` address uses TCP, the same frames): a socket rather than shared memory because a
peer that dies is an end-of-file or a reset on the next read or write, at once and without a
second channel, each process keeps sole ownership of its own pool, and the same frames would
cross machines; the price is two kernel copies per page, which the benchmark measures.

Kinds, decode to prefill: `hello` (the cache layout, checked against the prefill side's),
`prefill` (rid, token ids, salt), `cancel` (rid), `stats`. Prefill to decode: `hello`
(accepted or the mismatch), `page` (rid, page index, crc32 of the payload), `done` (rid,
seconds spent), `fail` (rid, sentence), `stats` (the prefill pool's counters).
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

_LEN = struct.Struct("!I")
MAX_HEADER = 1 << 24


class PeerGone(ConnectionError):
    """The other process closed the connection or died."""


def connect(address: str, timeout: float = 30.0) -> socket.socket:
    """A connected socket to `address` (a filesystem path, or host:port for TCP)."""
    sock = _socket_for(address)
    sock.settimeout(timeout)
    sock.connect(_target(address))
    sock.settimeout(None)
    return sock


def listen(address: str) -> socket.socket:
    """A listening socket on `address`; a stale Unix socket file is replaced."""
    sock = _socket_for(address)
    if _is_tcp(address):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    else:
        Path(address).unlink(missing_ok=True)
    sock.bind(_target(address))
    sock.listen(4)
    return sock


def _is_tcp(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and "/" not in address


def _socket_for(address: str) -> socket.socket:
    if _is_tcp(address):
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)


def _target(address: str) -> str | tuple[str, int]:
    if _is_tcp(address):
        host, _, port = address.rpartition(":")
        return (host, int(port))
    return address


class Channel:
    """One connected socket; `send` may be called from several threads, `recv` from one."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._send_lock = threading.Lock()
        self.closed = False

    def send(self, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
        head = dict(header, nbytes=len(payload))
        raw = json.dumps(head).encode()
        try:
            with self._send_lock:
                self.sock.sendall(_LEN.pack(len(raw)) + raw)
                if len(payload):
                    self.sock.sendall(payload)
        except OSError as exc:
            raise PeerGone(f"the peer process went away ({exc.strerror or exc})") from None

    def recv(self) -> tuple[dict[str, Any], bytearray]:
        (n,) = _LEN.unpack(self._read(_LEN.size))
        if n > MAX_HEADER:
            raise PeerGone(f"a message header of {n} bytes is not from a ctxlab peer")
        header = json.loads(bytes(self._read(n)))
        payload = self._read(int(header.get("nbytes", 0)))
        return header, payload

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:], n - got)
            except OSError as exc:
                raise PeerGone(f"the peer process went away ({exc.strerror or exc})") from None
            if k == 0:
                raise PeerGone("the peer process closed the connection")
            got += k
        return buf

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def crc(payload: bytes | bytearray | memoryview) -> int:
    return zlib.crc32(payload) & 0xFFFFFFFF
