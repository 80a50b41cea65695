"""Server URLs as ctxlab takes and shows them.

One rule for every base URL a command takes (`--server`, `--base-url`, `[[servers]]`): an
http(s) URL with a host; a trailing `/v1` (the form OpenAI's own clients take) and trailing
slashes are dropped, because ctxlab adds `/v1/...` itself. A URL may carry a password
(`http://user:SECRET@host`): it is sent as given, but everything ctxlab prints or writes
has the userinfo replaced, as an API key is never shown. A query string or fragment may
hold a key too (`?api_key=...`): printed URLs show it as `?***`.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from ctxlab.errors import CtxlabError

HIDDEN = "***"
# paths ctxlab adds itself: a base URL that already ends in one names an endpoint, not a server
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/chat/completions",
             "/completions", "/v1/embeddings", "/tokenize", "/metrics", "/health")  # fmt: skip
# scheme://userinfo@ : the userinfo runs to the last "@" before the path, query or fragment
_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s?#'\"]*@")
# a URL's query or fragment: from "?" or "#" to the end of the URL (space or quote)
_QUERY = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#'\"]*)([?#])[^\s'\"]*")


def redact(text: str) -> str:
    """`text` with the userinfo, query and fragment of every URL in it replaced
    (`http://***@host/path?***`)."""
    text = _USERINFO.sub(lambda m: f"{m.group(1)}{HIDDEN}@", text)
    return _QUERY.sub(lambda m: f"{m.group(1)}{m.group(2)}{HIDDEN}", text)


def public(url: str) -> str:
    """The URL to name a server by in reports: no userinfo, no query, no trailing slash."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal keeps its brackets
    try:
        port = parts.port
    except ValueError:
        port = None
    if port:
        host = f"{host}:{port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def base_url(url: str, flag: str = "--base-url") -> str:
    """The server root for `url` (the one rule above), or one sentence naming `flag`."""
    given = url.strip()
    parts = urlsplit(given)
    example = "e.g. http://127.0.0.1:8000"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CtxlabError(f"{flag} {redact(given)!r} must be an http(s) URL, {example}")
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number in range)
    except ValueError:
        raise CtxlabError(f"{flag} {redact(given)!r} has a bad port, {example}") from None
    if parts.query or parts.fragment:
        raise CtxlabError(f"{flag} {redact(given)!r} must not have a query or fragment")
    root = given.rstrip("/")
    endpoint = next((e for e in ENDPOINTS if root.endswith(e)), None)
    if endpoint is not None:  # a whole endpoint URL: /v1/chat/completions/v1/completions 404'd
        fix = root[: -len(endpoint)].rstrip("/") or "its root"
        raise CtxlabError(
            f"{flag} {redact(given)!r} names an endpoint ({endpoint}); give the server's root, "
            f"{redact(fix)} (ctxlab adds the /v1/... paths itself)"
        )
    if root.endswith("/v1"):
        root = root[: -len("/v1")].rstrip("/")
    return root
