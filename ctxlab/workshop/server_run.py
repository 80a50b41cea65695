"""What `ctxlab workshop --server` decides once, before the demonstrations run.

The server's page size (the probe's divergence staircase) and whether it reports cached
tokens are measured once; demonstrations then see the server's page, not the config's. When
a selected demonstration declares `ServerMode(chat=True)` the server's chat API is checked
(its token count of a test chat must match the local one) and becomes the run's chat
backend. The run's request backend (`Session.requests`) is set here, once. Every server of
the config gets the probe summary, the same staircase positions on each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ctxlab.progress import progress

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ctxlab.probe.prefix import PrefixResult
    from ctxlab.workshop.demonstration import Demonstration
    from ctxlab.workshop.result import JSONObject
    from ctxlab.workshop.server_backend import ServerLLM
    from ctxlab.workshop.server_compare import Summary
    from ctxlab.workshop.session import Session


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

    def cannot(self, demo: Demonstration[BaseModel]) -> str | None:
        """Why `demo` is not measurable through this server, or None."""
        mode = demo.server
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


def start(
    session: Session,
    server: ServerLLM,
    chat: bool,
    show: bool,
    name: str = "server",
    others: list[tuple[str, ServerLLM]] | None = None,
) -> ServerRun:
    """Measure the server's page and cached-token report, check its chat API when `chat`
    (a selected demonstration needs it), point `session.requests` at it and probe every
    server side by side."""
    from ctxlab.probe.client import ServerGone
    from ctxlab.workshop import server_demos
    from ctxlab.workshop.request_backend import ServerRequests
    from ctxlab.workshop.server_chat import ServerChatBackend

    label = server.label(code=True)
    chat_api = None
    try:
        with progress(f"measuring {server.label()}", enabled=show):
            cached = server.reports_cached()
            longest = staircase_tokens(session)
            pre = server_demos.probe_page(server, longest)
            chat_reason = None
            if chat:
                page = pre.granularity.value
                window = min(server.info.max_model_len or 10**9, session.cfg.model.max_model_len)
                api = ServerChatBackend(
                    server, session.loaded.tokenizer, window, page if isinstance(page, int) else 16
                )
                chat_reason = api.check_counts()
                chat_api = api if chat_reason is None else None
    except ServerGone as exc:
        run = ServerRun(server, label, None, False, show)
        run.stop("before", exc)
        return run
    run = ServerRun(server, label, pre, cached, show, chat_reason)
    session.requests = ServerRequests(session, server, chat_api)
    if run.page is not None:
        engine = session.cfg.engine.model_copy(update=dict(page_size=run.page))
        session.cfg = session.cfg.model_copy(update={"engine": engine})
    from ctxlab.workshop.server_compare import summarize

    for n, s in [(name, server), *(others or [])]:
        try:
            with progress(f"probe summary of {s.label()}", enabled=show):
                run.summaries.append(summarize(n, s, longest, pre if s is server else None))
        except ServerGone as exc:
            run.stop("during its probe summary", exc, s)
            break
    return run


def staircase_tokens(session: Session) -> int:
    """How far the server's divergence staircase reaches: 64 tokens at --quick sizes, else
    the longest prompt a demonstration's variant asks of it (`ServerMode.staircase`), within
    64 to 300 tokens."""
    from ctxlab.workshop.registry import REGISTERED

    if session.quick:
        return 64
    asked = [d.server.staircase(d.config(session.cfg)) for d in REGISTERED if d.server.staircase]
    return max(64, min(300, max(asked, default=64)))


def summaries(results: JSONObject, run: ServerRun) -> None:
    """results["servers"]: each server probed, and the side-by-side probe table."""
    from dataclasses import asdict

    from ctxlab.workshop.server_compare import probe_table

    if not run.summaries:
        return
    results["servers"] = [s.as_dict() for s in run.summaries]
    results["servers_table"] = asdict(probe_table(run.summaries))


def gone_sentence(server: ServerLLM, when: str, exc: Exception) -> str:
    return (
        f"the server at {server.info.url} stopped answering {when} ({exc}); what was measured "
        "before it is kept in the report"
    )
