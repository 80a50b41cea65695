"""What `ctxlab workshop --server` decides once, before the demonstrations run.

The server's page size (the probe's divergence staircase) and whether it reports cached
tokens are measured once; demonstrations then see the server's page, not the config's. When
a selected demonstration declares `ServerMode(chat=True)` the server's chat API is checked
(its token count of a test chat must match the local one) and becomes the run's chat
backend. The run's request backend (`Session.requests`) is set here, once. Every server of
the config gets the probe summary, the same staircase positions on each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxlab.progress import progress
from ctxlab.workshop.server_findings import ServerRun

if TYPE_CHECKING:
    from ctxlab.workshop.result import JSONObject
    from ctxlab.workshop.server_backend import ServerLLM
    from ctxlab.workshop.session import Session


def start(
    session: Session,
    server: ServerLLM,
    chat: bool,
    show: bool,
    name: str = "server",
    others: list[tuple[str, ServerLLM]] | None = None,
    *,
    summarize: bool = True,
) -> ServerRun:
    """Measure the server's page and cached-token report, check its chat API when `chat`
    (a selected demonstration needs it), point `session.requests` at it and, when
    `summarize`, probe every server side by side (a further server's own pass, which the
    first run's summary already covers, does not)."""
    from ctxlab.probe.client import ServerGone
    from ctxlab.workshop.request_backend import ServerRequests
    from ctxlab.workshop.server_chat import ServerChatBackend
    from ctxlab.workshop.server_compare import probe_page

    label = server.label(code=True)
    chat_api = None
    try:
        with progress(f"measuring {server.label()}", enabled=show):
            cached = server.reports_cached()
            longest = staircase_tokens(session)
            pre = probe_page(server, longest)
            if not isinstance(pre.granularity.value, int):
                # pages longer than the --quick staircase (vLLM's 128 on CPU): once more,
                # long enough for two whole pages of up to 128 tokens and a tail
                longest = LONGEST_STAIRCASE
                pre = probe_page(server, longest)
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
        run.stop("before the first demonstration, while its page size was measured", exc)
        return run
    run = ServerRun(server, label, pre, cached, show, chat_reason)
    session.requests = ServerRequests(session, server, chat_api)
    if run.page is not None:
        engine = session.cfg.engine.model_copy(update=dict(page_size=run.page))
        session.cfg = session.cfg.model_copy(update={"engine": engine})
    from ctxlab.workshop.server_compare import summarize as summary

    for n, s in [(name, server), *(others or [])] if summarize else []:
        try:
            with progress(f"probe summary of {s.label()}", enabled=show):
                run.summaries.append(summary(n, s, longest, pre if s is server else None))
        except ServerGone as exc:
            run.stop("during its probe summary", exc, s)
            break
    return run


def staircase_tokens(session: Session) -> int:
    """How far the server's divergence staircase reaches: 64 tokens at --quick sizes, else
    the longest prompt a demonstration's variant asks of it (`ServerMode.staircase`), within
    64 to 300 tokens. Where 64 leaves the page unresolved, `start` measures again at 300."""
    from ctxlab.workshop.registry import REGISTERED

    if session.quick:
        return 64
    asked = [d.server.staircase(d.config(session.cfg)) for d in REGISTERED if d.server.staircase]
    return max(64, min(LONGEST_STAIRCASE, max(asked, default=64)))


LONGEST_STAIRCASE = 300  # tokens: two whole 128-token pages and a tail


def summaries(results: JSONObject, run: ServerRun) -> None:
    """results["servers"]: each server probed, and the side-by-side probe table."""
    from dataclasses import asdict

    from ctxlab.workshop.server_compare import probe_table

    if not run.summaries:
        return
    results["servers"] = [s.as_dict() for s in run.summaries]
    results["servers_table"] = asdict(probe_table(run.summaries))
