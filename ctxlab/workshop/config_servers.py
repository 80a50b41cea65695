"""`[[servers]]` in the workshop config: the deployments a run measures through their
OpenAI API (`ctxlab workshop` with no `--server`; `--server URL` replaces the list).

    [[servers]]
    label = "vllm-p16"                # names the server in every table; labels must differ
    url = "http://gpu-box:8000"       # the server root (a trailing /v1 is dropped)
    api_key = "..."                   # optional; sent as a Bearer key, never written out
    model = "meta-llama/Llama-3.1-8B" # optional: the model to use when it serves several
    timeout = 120                     # optional: seconds one request may take in total
                                      # (default 600; `--server-timeout` overrides it)
    kv_events = "tcp://127.0.0.1:5557" # optional: its KV-event publisher on this machine
                                      # (vLLM --kv-events-config): demonstration 4 counts
                                      # the blocks it evicts from the events

The first server carries every demonstration a server can run; every listed server gets
the probe summary and demonstration 3 side by side (`server_compare.py`).
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_serializer, field_validator


class ServerEntry(BaseModel):
    """One `[[servers]]` entry."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    label: str = Field(min_length=1)
    url: str = Field(min_length=1)
    api_key: str | None = Field(default=None, exclude=True, repr=False)  # never written out
    model: str | None = None
    timeout: float | None = None  # seconds per request in total; None: DEFAULT_TIMEOUT
    kv_events: str | None = None  # the server's KV-event publisher (tcp:// loopback, ipc://)

    @field_validator("kv_events")
    @classmethod
    def _kv_events(cls, endpoint: str | None) -> str | None:
        from ctxlab.errors import CtxlabError
        from ctxlab.probe.events import check_endpoint

        try:
            return None if endpoint is None else check_endpoint(endpoint, "the endpoint")
        except CtxlabError as exc:
            raise ValueError(str(exc).rstrip(".")) from None

    @field_validator("api_key")
    @classmethod
    def _key(cls, key: str | None) -> str | None:
        from ctxlab.errors import CtxlabError
        from ctxlab.peer.key import check_key

        try:
            return check_key(key, "api_key")
        except CtxlabError as exc:
            raise ValueError(str(exc).rstrip(".")) from None

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: float | None) -> float | None:
        return None if value is None else timeout_error(value)

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        from ctxlab.errors import CtxlabError
        from ctxlab.probe.identify import check_url

        try:
            return check_url(url)
        except CtxlabError as exc:
            raise ValueError(str(exc).removeprefix("--server ")) from None

    @field_serializer("url")
    def _shown(self, url: str) -> str:
        """Written out without credentials (`http://user:pass@host` keeps only the host)."""
        from ctxlab.peer.url import redact

        return redact(url)


DEFAULT_TIMEOUT = 600.0  # seconds one request to a server may take in total
MAX_TIMEOUT = 86_400.0  # a day: longer is a typo, and overflows some waits


def timeout_error(value: float) -> float:
    """`value` if it is a usable request timeout in seconds; else ValueError saying what is
    allowed (the caller names the key or the option)."""
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT):
        raise ValueError(f"must be more than 0 and at most {MAX_TIMEOUT:g} seconds (a day)")
    return float(value)


def _distinct(servers: list[ServerEntry]) -> list[ServerEntry]:
    seen: set[str] = set()
    for s in servers:
        if s.label in seen:
            raise ValueError(f"label {s.label!r} is given to two servers; labels must differ")
        seen.add(s.label)
    return servers


ServerList = Annotated[list[ServerEntry], AfterValidator(_distinct)]
