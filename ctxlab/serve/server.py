"""Run the app with uvicorn on a socket bound here, so port 0 (a free port) works and the
real address is known before the first request: `ctxlab serve` prints it, tests read it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from ctxlab.errors import CtxlabError


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port), or one clear sentence."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CtxlabError(f"cannot listen on {host}:{port}: {exc.strerror}.") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def check_log_level(log_level: str) -> str:
    """uvicorn's level names, checked before the model loads and before `ready` is printed."""
    from uvicorn.config import LOG_LEVELS

    if log_level not in LOG_LEVELS:
        raise CtxlabError(
            f"--log-level {log_level!r} is unknown; use one of {', '.join(LOG_LEVELS)}."
        )
    return log_level


class _Server(uvicorn.Server):
    """uvicorn's server, which first tells the app a shutdown began (SIGTERM, Ctrl-C): open
    streams then end with an error event and `[DONE]` within the graceful window, instead
    of being cut when it runs out."""

    def handle_exit(self, sig: int, frame: object) -> None:
        begin_shutdown(self.config.app)
        super().handle_exit(sig, frame)  # type: ignore[arg-type]


def begin_shutdown(app: object) -> None:
    """Wake every open stream of `app` (any thread, a signal handler included)."""
    state = getattr(app, "state", None)
    closing = getattr(state, "closing", None)
    event_loop = getattr(state, "event_loop", None)
    if closing is not None and event_loop is not None and not event_loop.is_closed():
        event_loop.call_soon_threadsafe(closing.set)


def _server(app: FastAPI, log_level: str) -> uvicorn.Server:
    check_log_level(log_level)
    config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5)
    return _Server(config)


def serve(
    app: FastAPI,
    sock: socket.socket,
    log_level: str = "warning",
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve on a socket from `bind` until interrupted; `on_ready(url)` is called once the
    server is configured (a bad option fails before `ready` is printed)."""
    server = _server(app, log_level)
    if on_ready is not None:
        on_ready(url_of(sock))
    server.run(sockets=[sock])


def start_in_thread(app: FastAPI, host: str = "127.0.0.1", timeout: float = 60.0):
    """Serve in a background thread on a free port (for tests); (server, url).

    Stop it with `server.should_exit = True` and join `server.thread`.
    """
    sock = bind(host, 0)
    server = _server(app, "warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    server.thread = thread  # type: ignore[attr-defined]
    thread.start()
    end = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > end:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return server, url_of(sock)
