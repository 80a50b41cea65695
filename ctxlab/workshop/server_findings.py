"""What `ctxlab workshop --server` found before the demonstrations ran (`ServerRun`): the
server's page, whether it reports cached tokens, its chat API's standing, the probe summary
of every server, and whether it stopped answering. Plain findings, so a demonstration's
server variant can read them without importing the code that measured them
(`server_run.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ctxlab.probe.prefix import PrefixResult
    from ctxlab.workshop.server_backend import ServerLLM
    from ctxlab.workshop.server_compare import Summary


class ServerNeeds(Protocol):
    """What a demonstration's `ServerMode` asks of a server."""

    @property
    def chat(self) -> bool: ...
    @property
    def needs_cached_tokens(self) -> bool: ...


@dataclass
class ServerRun:
    """What `--server` decided before the demonstrations ran."""

    server: ServerLLM
    label: str
    staircase: PrefixResult | None  # None when the server died first
    cached_reported: bool
    show: bool = True
    chat_reason: str | None = None  # why a demonstration cannot use its chat API
    gone: str | None = None  # the server stopped answering: the sentence, and no more demos
    summaries: list[Summary] = field(default_factory=list)  # the first server first

    @property
    def page(self) -> int | None:
        """The server's reuse granularity in tokens, when the staircase resolved it."""
        value = self.staircase.granularity.value if self.staircase is not None else None
        return value if isinstance(value, int) else None

    def cannot(self, mode: ServerNeeds) -> str | None:
        """Why a demonstration that declares `mode` is not measurable through this server,
        or None."""
        if mode.needs_cached_tokens and not self.cached_reported:
            return (
                "the server does not report cached prompt tokens (vLLM needs "
                "--enable-prompt-tokens-details, SGLang --enable-cache-report)"
            )
        if mode.chat and self.chat_reason is not None:
            return self.chat_reason
        return None

    def stop(self, when: str, exc: Exception, server: ServerLLM | None = None) -> str:
        self.gone = gone_sentence(server or self.server, when, exc)
        return self.gone


def gone_sentence(server: ServerLLM, when: str, exc: Exception) -> str:
    return (
        f"the server at {server.info.url} stopped answering {when} ({exc}); what was measured "
        "before it is kept in the report"
    )
