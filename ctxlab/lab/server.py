"""The lab's local web server: one static page and a JSON endpoint over the planner.

Standard library only (`http.server`), so `ctxlab lab` runs from a fresh install with no web
framework and no build step, and never imports torch. The page's numbers all come from
`/api/plan`, which calls `ctxlab.plan`; the page itself only lays them out.

Routes:
- `GET /` and `GET /static/<file>`: the page, its stylesheet and its script.
- `GET /api/meta`: presets and the form's fields (label, stack layer, unit, default).
- `GET /api/plan?field=value...` or `POST /api/plan` with a JSON object: the four figures,
  the capacity sentence and the chart points; 400 with `{"error", "field", "errors"}` when a
  field is wrong.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ctxlab.errors import CtxlabError
from ctxlab.inputs import loads_json
from ctxlab.lab.api import lab_meta, plan_response

STATIC_TYPES: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "lab.css": "text/css; charset=utf-8",
    "lab.js": "text/javascript; charset=utf-8",
}
MAX_BODY_BYTES = 64 * 1024  # a form is a few hundred bytes; refuse anything absurd


def static_bytes(name: str) -> bytes:
    """A file of the page, read from the installed package (works from a wheel too)."""
    return resources.files("ctxlab.lab").joinpath("static", name).read_bytes()


class LabHandler(BaseHTTPRequestHandler):
    """Serves the page and the endpoint; every failure is an answer, never a dead server."""

    server_version = "ctxlab-lab"
    quiet = True

    def log_message(self, format: str, *args: Any) -> None:
        if not self.quiet:
            super().log_message(format, *args)

    # -- answers ------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self._send(status, body, "application/json; charset=utf-8")

    def _error(self, status: int, message: str, field: str | None = None) -> None:
        errors = {field: message} if field else {}
        self._json(status, {"error": message, "field": field, "errors": errors})

    # -- routing ------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(self._post)

    def _guarded(self, route: Any) -> None:
        """Run a route; a bug becomes a 500 with its message, and the server keeps serving."""
        try:
            route()
        except Exception as exc:
            print(f"ctxlab lab: internal error on {self.path}: {exc!r}", file=sys.stderr)
            with contextlib.suppress(OSError):  # the client may have gone away
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {exc}")

    def _get(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        if path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, static_bytes("index.html"), STATIC_TYPES["index.html"])
        elif path.startswith("/static/") and path[len("/static/") :] in STATIC_TYPES:
            name = path[len("/static/") :]
            self._send(HTTPStatus.OK, static_bytes(name), STATIC_TYPES[name])
        elif path == "/api/meta":
            self._json(HTTPStatus.OK, lab_meta())
        elif path == "/api/plan":
            self._plan(dict(parse_qsl(url.query, keep_blank_values=True)))
        elif path == "/favicon.ico":
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no such page {path!r}; the lab serves / and /api")

    def _post(self) -> None:
        if urlsplit(self.path).path != "/api/plan":
            self._error(HTTPStatus.NOT_FOUND, "only /api/plan accepts POST")
            return
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raw = self._read_chunked()  # no Content-Length: the body comes in chunks
            if raw is None:
                return
        else:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY_BYTES:
                self._error(HTTPStatus.BAD_REQUEST, "the request body is missing or too large")
                return
            raw = self.rfile.read(length)
        try:
            data = loads_json(raw or b"{}", "the request body")
        except CtxlabError as exc:  # bad JSON, nested too deep, a non-finite number, not text
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        if not isinstance(data, dict):
            self._error(HTTPStatus.BAD_REQUEST, "the request body must be a JSON object")
            return
        self._plan(data)

    def _read_chunked(self) -> bytes | None:
        """A `Transfer-Encoding: chunked` body, at most MAX_BODY_BYTES (None: refused, the
        400 already sent). Without this the body was ignored and the defaults planned."""
        body = b""
        while True:
            line = self.rfile.readline(64).split(b";", 1)[0].strip()
            try:
                size = int(line, 16)
            except ValueError:
                self._error(HTTPStatus.BAD_REQUEST, "the chunked request body is malformed")
                return None
            if size < 0 or len(body) + size > MAX_BODY_BYTES:
                self._error(HTTPStatus.BAD_REQUEST, "the request body is missing or too large")
                return None
            if size == 0:
                while self.rfile.readline(1024).strip():  # trailers, up to the blank line
                    pass
                return body
            body += self.rfile.read(size)
            self.rfile.readline(8)  # the CRLF after each chunk

    def _plan(self, data: dict[str, Any]) -> None:
        try:
            status, payload = plan_response(data)
        except CtxlabError as exc:
            status, payload = HTTPStatus.BAD_REQUEST, {"error": str(exc), "field": None}
            payload["errors"] = {}
        self._json(status, payload)


def make_server(
    host: str = "127.0.0.1", port: int = 8765, quiet: bool = True
) -> ThreadingHTTPServer:
    """A bound, not yet serving, lab server; port 0 picks a free port (see `server_port`)."""
    handler = type("BoundLabHandler", (LabHandler,), {"quiet": quiet})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def server_url(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in str(host) else host
    return f"http://{shown}:{port}/"


def start_in_thread(host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Serve in a daemon thread (tests, notebooks); call `server.shutdown()` to stop."""
    server = make_server(host, port)
    thread = threading.Thread(target=server.serve_forever, name="ctxlab-lab", daemon=True)
    thread.start()
    return server, server_url(server)
