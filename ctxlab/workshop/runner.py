"""One workshop run: load the model once, run the selected demonstrations, judge, write.

The order is fixed: the registered demonstrations in number order (one that `--only` leaves
out is recorded with that status and no numbers), the small
useful-context eval, the six context numbers, the verdicts, the required-metric check, the
"what could go wrong" list, then results.json, and the Markdown and HTML reports rendered
from the results.json just written. The run's status is "complete" only when every required
metric of the selected demonstrations was measured.
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ctxlab.progress import progress
from ctxlab.workshop import checklist
from ctxlab.workshop.context_numbers import context_numbers
from ctxlab.workshop.measure import Timer, load_average
from ctxlab.workshop.registry import REGISTERED, WorkshopConfig, metric_ref
from ctxlab.workshop.result import DemoResult, JSONObject, Table
from ctxlab.workshop.session import Session
from ctxlab.workshop.verdicts import VERDICT_KINDS, Verdict, judge

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ctxlab.model import LoadedModel
    from ctxlab.probe.prefix import PrefixResult
    from ctxlab.workshop.demonstration import Demonstration
    from ctxlab.workshop.server_backend import ServerLLM

SCHEMA = "ctxlab.workshop/1"
COST_UNIT_REQUESTS = 1000  # cost tables price this many requests


def load_default_model(cfg: WorkshopConfig, enabled: bool = True) -> LoadedModel:
    from ctxlab.engine_options import EngineOptions

    EngineOptions(model=cfg.model.source, dtype=cfg.model.dtype).check()
    if cfg.model.threads:
        import torch

        torch.set_num_threads(cfg.model.threads)
    from ctxlab.model import load_model

    with progress(f"loading {cfg.model.source}", enabled=enabled):
        loaded = load_model(cfg.model.source, dtype=cfg.model.dtype)
        _ = loaded.tokenizer
    return loaded


def run_workshop(
    cfg: WorkshopConfig,
    out: Path,
    *,
    quick: bool = False,
    only: set[int] | None = None,
    config_label: str = "the embedded default config",
    loaded: LoadedModel | None = None,
    show_progress: bool = True,
    server: ServerLLM | None = None,
    servers: list[tuple[str, ServerLLM]] | None = None,
) -> JSONObject:
    """Run, write results.json, report.md and report.html under `out`; return the results.

    `server` (a `ServerLLM`, from `ctxlab workshop --server` or the first `[[servers]]`):
    demonstrations 1 and 2 send their requests to it, 3 measures its page size, 4 is sized
    to its probed cache (`server_eviction.py`), 5 and 6 use its chat API, 7 runs as without
    a server plus its short and long workloads sent to it. `servers`: every (label, server)
    of the config, the first included: each gets the probe summary and demonstration 3
    side by side (`server_compare.py`). A server that stops answering ends the run early
    with `results["error"]` saying so; what was measured before is kept."""
    load0 = load_average()
    with Timer() as total:
        if loaded is None:
            loaded = load_default_model(cfg, show_progress)
        elif cfg.model.threads:
            import torch

            torch.set_num_threads(cfg.model.threads)
        session = Session(cfg, loaded, out, quick=quick)
        session.check_arch()
        through = None
        if server is not None:
            others = [(n, s) for n, s in (servers or []) if s is not server]
            name = next((n for n, s in (servers or []) if s is server), "server")
            through = _through_server(session, server, only, show_progress, name, others)
        demos = _run_demos(session, only, show_progress, through)
        gone = through.gone if through is not None else None
        useful = None
        if cfg.useful_context.enabled and only is None and gone is None:
            useful = _useful_context(session, show_progress)
        demo_json = {k: d.to_json(out) for k, d in demos.items()}
        results: JSONObject = {
            "schema": SCHEMA,
            "config": cfg.model_dump(),
            "demos": demo_json,
            "useful_context": useful,
        }
        if server is not None:
            results["server"] = {**server.info.as_dict(), "label": server.label(code=True)}
            results["error"] = gone or ""
            _server_summaries(results, through)
        results["context_numbers"] = context_numbers(session, demo_json, useful)
        verdicts = _verdicts(cfg, demos)
        results["verdicts"] = [v.to_json() for v in verdicts]
        counts = {k: sum(1 for v in verdicts if v.verdict == k) for k in VERDICT_KINDS}
        results["verdict_counts"] = counts
        results["required_metrics"] = _required(cfg, demos, only)
        results["checklist"] = checklist.evaluate(results)
    import torch

    missing = [r for r in results["required_metrics"] if r["required"] and not r["measured"]]
    results["status"] = "incomplete" if missing else "complete"
    results["status_reason"] = (
        f"{len(missing)} required metric(s) not measured: "
        + "; ".join(f"{r['metric']} ({r['why']})" for r in missing)
        if missing
        else "every required metric of the selected demonstrations was measured"
    )
    results["run"] = {
        "config": config_label,
        "quick": quick,
        "only": sorted(only) if only else None,
        "model": cfg.model.source,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": round(total.wall_s, 1),
        "cpu_s": round(total.cpu_s, 1),
        "load_average_start": load0,
        "load_average_end": load_average(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "cost_unit_requests": COST_UNIT_REQUESTS,
    }
    write_reports(results, out)
    return results


# Through a server: the demonstrations whose requests go to it.
THROUGH_SERVER = ("prefix_miss", "warm_prefix", "compaction", "retrieval_depth")
NEEDS_CACHED_TOKENS = ("prefix_miss", "warm_prefix", "eviction")


@dataclass
class Through:
    """What `--server` decided before the demonstrations ran."""

    label: str
    staircase: PrefixResult | None  # None when the server died first
    cached_reported: bool
    show: bool = True
    chat_reason: str | None = None  # why demonstrations 5 and 6 cannot use its chat API
    gone: str | None = None  # the server stopped answering: the sentence, and no more demos
    summaries: list = field(default_factory=list)  # server_compare.Summary, the first first


def _through_server(
    session: Session,
    server: ServerLLM,
    only: set[int] | None,
    show: bool,
    name: str = "server",
    others: list[tuple[str, ServerLLM]] | None = None,
) -> Through:
    """Measure the server's page size once (demonstrations 1 and 3 need it) and whether it
    reports cached tokens; demonstrations then see the server's page, not the config's.
    Demonstrations 5 and 6 get its chat API, once its token counts match the local ones."""
    from ctxlab.probe.client import ServerGone
    from ctxlab.workshop import server_demos
    from ctxlab.workshop.server_chat import ServerChatBackend

    session.server = server
    label = server.label(code=True)
    try:
        with progress(f"measuring {server.label()}", enabled=show):
            cached = server.reports_cached()
            longest = 64 if session.quick else max(64, min(300, session.cfg.page_size.pair_tokens))
            pre = server_demos.probe_page(server, longest)
            chat_reason = None
            if only is None or only & {5, 6}:
                page = pre.granularity.value
                window = min(server.info.max_model_len or 10**9, session.cfg.model.max_model_len)
                chat = ServerChatBackend(
                    server, session.loaded.tokenizer, window, page if isinstance(page, int) else 16
                )
                chat_reason = chat.check_counts()
                session.server_chat = chat if chat_reason is None else None
    except ServerGone as exc:
        return Through(label, None, False, show, gone=gone_sentence(server, "before", exc))
    through = Through(label, pre, cached, show, chat_reason)
    page = pre.granularity.value
    if isinstance(page, int):
        engine = session.cfg.engine.model_copy(update={"page_size": page})
        session.cfg = session.cfg.model_copy(update={"engine": engine})
    # the probe summary of every server, the same staircase positions on each
    from ctxlab.workshop.server_compare import summarize

    for n, s in [(name, server), *(others or [])]:
        try:
            with progress(f"probe summary of {s.label()}", enabled=show):
                through.summaries.append(summarize(n, s, longest, pre if s is server else None))
        except ServerGone as exc:
            through.gone = gone_sentence(s, "during its probe summary", exc)
            break
    return through


def _server_summaries(results: JSONObject, through: Through | None) -> None:
    """results["servers"]: each server probed, and the side-by-side probe table."""
    from dataclasses import asdict

    from ctxlab.workshop.server_compare import probe_table

    if through is None or not through.summaries:
        return
    results["servers"] = [s.as_dict() for s in through.summaries]
    results["servers_table"] = asdict(probe_table(through.summaries))


def gone_sentence(server: ServerLLM, when: str, exc: Exception) -> str:
    return (
        f"the server at {server.info.url} stopped answering {when} ({exc}); what was measured "
        "before it is kept in the report"
    )


def _run_demos(
    session: Session, only: set[int] | None, show: bool, through: Through | None = None
) -> dict[str, DemoResult]:
    """Each demonstration in order; through a server that stops answering, the one that
    was running and every later one are "not measurable" with that sentence."""
    from ctxlab.probe.client import ServerGone
    from ctxlab.workshop.server_demos import not_measurable

    demos: dict[str, DemoResult] = {}
    for demo in REGISTERED:
        if only is not None and demo.number not in only:
            demos[demo.key] = DemoResult.of(demo, "not selected", "")
            continue
        if through is not None and through.gone is not None:
            demos[demo.key] = not_measurable(demo.key, f"not run: {through.gone}")
            continue
        try:
            demos[demo.key] = _one_demo(session, demo, show, through)
        except ServerGone as exc:
            assert through is not None
            through.gone = gone_sentence(session.server, f"in demonstration {demo.number}", exc)
            demos[demo.key] = not_measurable(demo.key, through.gone)
    return demos


def _one_demo(
    session: Session, demo: Demonstration[BaseModel], show: bool, through: Through | None
) -> DemoResult:
    if through is not None:
        early = _server_variant(session, demo.key, through)
        if early is not None:
            return early
    label = f"demonstration {demo.number}/{len(REGISTERED)}: {demo.title}"
    session.use_server = through is not None and demo.key in THROUGH_SERVER
    try:
        with progress(label, demo.steps(session), enabled=show) as tracker, Timer() as t:
            res = demo.run(session, tracker)
    finally:
        session.use_server = False
    if through is not None and demo.key == "recurrent_vs_kv":
        from ctxlab.workshop.server_demos import recurrent_rows

        with progress(f"demonstration 7 on {session.server.label()}", enabled=show), Timer() as t2:
            recurrent_rows(session, res)
        t.wall_s, t.cpu_s = t.wall_s + t2.wall_s, t.cpu_s + t2.cpu_s
    res.wall_s, res.cpu_s = t.wall_s, t.cpu_s
    if through is not None:
        _name_the_server(res, demo.key, through.label)
        if demo.key in ("compaction", "retrieval_depth"):
            res.notes.append(
                f"Every model call went to the chat API of {through.label} "
                "(`/v1/chat/completions`: its own chat template and model); budgets were "
                "counted with the local tokenizer, checked first against the server's count "
                "of a test chat; reused tokens are the server's cached_tokens."
            )
    return res


def _server_variant(session: Session, key: str, through: Through) -> DemoResult | None:
    """The result for a demonstration that cannot run as written through a server."""
    from ctxlab.workshop import server_demos

    if key in NEEDS_CACHED_TOKENS and not through.cached_reported:
        return server_demos.not_measurable(
            key, "the server does not report cached prompt tokens (vLLM needs "
            "--enable-prompt-tokens-details, SGLang --enable-cache-report)",
        )  # fmt: skip
    if key in ("compaction", "retrieval_depth") and through.chat_reason is not None:
        return server_demos.not_measurable(key, through.chat_reason)
    if key == "page_size":
        res = server_demos.page_size(session, through.staircase)
        _name_the_server(res, key, through.label)
        if len(through.summaries) > 1:
            from ctxlab.workshop.server_compare import page_tables

            res.tables += page_tables(through.summaries, session.cfg.page_size.request_tokens)
        return res
    if key == "eviction":
        from ctxlab.workshop import server_eviction

        page = through.staircase.granularity.value
        label = f"demonstration 4/{len(REGISTERED)}: eviction sized to {session.server.label()}"
        with progress(label, enabled=through.show), Timer() as t:
            res = server_eviction.run(session, page if isinstance(page, int) else None)
        res.wall_s, res.cpu_s = t.wall_s, t.cpu_s
        return res
    return None


def _name_the_server(res: DemoResult, key: str, label: str) -> None:
    where = f"through {label}" if key in THROUGH_SERVER or key == "page_size" else (
        "on the local engine, not the server"
    )  # fmt: skip
    for table in res.tables:
        if label not in table.title:
            table.title = f"{table.title} ({where})"
        if key in THROUGH_SERVER and "read from the pool" in table.note:
            table.note += (
                " (through a server: the planner's bytes per token for the local model; the "
                "server's own pool is not visible through its API)"
            )


def _useful_context(session: Session, show: bool) -> JSONObject:
    from ctxlab.workshop import useful_context

    label = "measured useful context: a small eval"
    with progress(label, useful_context.steps(session), enabled=show) as tracker:
        result = useful_context.measure(session, tracker)
    result["table"] = _table_json(useful_context.table(result))
    return result


def _table_json(table: Table) -> JSONObject:
    from dataclasses import asdict

    return asdict(table)


def _verdicts(cfg: WorkshopConfig, demos: dict[str, DemoResult]) -> list[Verdict]:
    """Every prediction judged; a timing measured once (no repeats, no interval of its own)
    is read against the largest scatter of repeated timings in this run, since the same
    machine produced both: a change smaller than that is within noise, never held."""
    from dataclasses import replace

    from ctxlab.workshop.registry import BY_KEY

    def timed(key: str, metric: str) -> bool:
        m = BY_KEY[key].metric(metric)
        return m is not None and m.unit in ("ms", "s")

    spreads = [
        (o.noise, d.number)
        for key, d in demos.items()
        for name, o in d.observations.items()
        if timed(key, name) and o.noise is not None and math.isfinite(o.noise)
    ]
    run_noise = max(spreads, default=None)
    out = []
    for key, predictions in cfg.predictions.items():
        demo = demos[key]
        for metric, p in predictions.items():
            if demo.status == "not measurable":
                out.append(judge(demo.number, key, metric, p, None, demo.summary))
            elif demo.status != "run":
                why = f"demonstration {demo.number} was {demo.status}"
                out.append(judge(demo.number, key, metric, p, None, why))
                continue
            obs = demo.observations.get(metric)
            if (
                obs is not None
                and run_noise is not None
                and timed(key, metric)
                and obs.noise is None
                and obs.change_low is None
            ):
                obs = replace(
                    obs,
                    noise=run_noise[0],
                    test=f"timed without repeats: read against the largest scatter of repeated "
                    f"timings in this run, {100 * run_noise[0]:.1f}% (demonstration "
                    f"{run_noise[1]})",
                )
            out.append(judge(demo.number, key, metric, p, obs))
    return out


def _required(cfg: WorkshopConfig, demos: dict[str, DemoResult], only: set[int] | None) -> list:
    rows = []
    for ref in cfg.required_metrics:
        found = metric_ref(ref)
        assert not isinstance(found, str)  # the config checked every name
        demo_spec, metric = found
        demo = demos[demo_spec.key]
        # A demonstration a server cannot run is not required of that run; its verdicts
        # and the report say why.
        through = demo.status == "not measurable"
        selected = (only is None or demo_spec.number in only) and not through
        obs = demo.observations.get(metric.name)
        measured = obs is not None and obs.measurable
        if through:
            why = demo.summary
        elif not selected:
            why = "not selected with --only"
        elif demo.status != "run":
            why = f"demonstration {demo.number} was {demo.status}"
        elif obs is None:
            why = "the demonstration did not report it"
        elif not measured:
            why = obs.why_missing or "a value came out undefined"
        else:
            why = ""
        rows.append({"metric": ref, "required": selected, "measured": measured, "why": why})
    return rows


def write_reports(results: JSONObject, out: Path) -> dict[str, Path]:
    """results.json first; both reports are rendered from what was written to it."""
    from ctxlab.workshop.document import build_document
    from ctxlab.workshop.report_html import render_html
    from ctxlab.workshop.report_markdown import render_markdown

    paths = {
        "results": out / "results.json",
        "markdown": out / "report.md",
        "html": out / "report.html",
    }
    results["files"] = {k: p.name for k, p in paths.items()}
    paths["results"].write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    stored = json.loads(paths["results"].read_text(encoding="utf-8"))
    blocks = build_document(stored)
    paths["markdown"].write_text(render_markdown(blocks), encoding="utf-8")
    paths["html"].write_text(render_html(blocks, out), encoding="utf-8")
    return paths
