"""One workshop run: load the model once, run the selected demonstrations, judge, write.

The order is fixed: the registered demonstrations in number order (one that `--only` leaves
out is recorded with that status and no numbers), the small
useful-context eval, the six context numbers, the verdicts, the required-metric check, the
"what could go wrong" list, then results.json, and the Markdown and HTML reports rendered
from the results.json just written. The run's status is "complete" only when every required
metric of the selected demonstrations was measured; "stopped early" when a server stopped
answering, "interrupted" on SIGINT (the finished demonstrations are kept), "incomplete"
otherwise. Nothing here names a demonstration: what server mode, the document and the
context numbers need is declared on `Demonstration`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ctxlab.outputs import write_text
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
    from ctxlab.workshop.demonstration import Demonstration
    from ctxlab.workshop.server_backend import ServerLLM
    from ctxlab.workshop.server_findings import ServerRun

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

    `server` (a `ServerLLM`, from `ctxlab workshop --server` or the first `[[servers]]`)
    becomes the run's request backend (`server_run.start`); each demonstration's
    `ServerMode` says what it does with it. `servers`: every (label, server) of the config,
    the first included: each gets the probe summary side by side (`server_compare.py`). A
    server that stops answering ends the run early with `results["error"]` saying so; what
    was measured before is kept. SIGINT during a demonstration or the eval ends the run the
    same way: the finished demonstrations are kept, the report is written and says
    "interrupted" (`results["interrupted"]`)."""
    load0 = load_average()
    started = datetime.now(UTC)
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
            from ctxlab.workshop import server_run

            others = [(n, s) for n, s in (servers or []) if s is not server]
            name = next((n for n, s in (servers or []) if s is server), "server")
            chat = any(d.server.chat for d in REGISTERED if only is None or d.number in only)
            through = server_run.start(session, server, chat, show_progress, name, others)
        demos, interrupted = _run_demos(session, only, show_progress, through)
        gone = through.gone if through is not None else None
        peers: dict[str, JSONObject] = {}
        if server is not None and gone is None and not interrupted:
            try:
                peers = _peer_passes(cfg, session, server, servers or [], only, show_progress)
            except KeyboardInterrupt:
                interrupted = "while a further server was measured"
        useful = None
        if cfg.useful_context.enabled and only is None and gone is None and not interrupted:
            try:
                useful = _useful_context(session, show_progress)
            except KeyboardInterrupt:
                interrupted = "in the useful-context eval"
        demo_json = {k: d.to_json(out) for k, d in demos.items()}
        results: JSONObject = {
            "schema": SCHEMA,
            "config": cfg.model_dump(),
            "demos": demo_json,
            "useful_context": useful,
        }
        if server is not None:
            from ctxlab.workshop import server_run

            results["server"] = {**server.info.as_dict(), "label": server.label(code=True)}
            results["error"] = gone or ""
            if through is not None:
                server_run.summaries(results, through)
            if peers:
                results["peers"] = peers
        results["interrupted"] = interrupted or ""
        results["context_numbers"] = context_numbers(session, demo_json, useful)
        verdicts = _verdicts(cfg, demos)
        results["verdicts"] = [v.to_json() for v in verdicts]
        counts = {k: sum(1 for v in verdicts if v.verdict == k) for k in VERDICT_KINDS}
        results["verdict_counts"] = counts
        results["required_metrics"] = _required(cfg, demos, only, server is not None)
        results["checklist"] = checklist.evaluate(results)
    import torch

    results["status"], results["status_reason"] = _status(results)
    results["run"] = {
        "config": config_label,
        "quick": quick,
        "only": sorted(only) if only else None,
        "model": cfg.model.source,
        "started": started.isoformat(timespec="seconds"),
        "wall_s": round(total.wall_s, 1),
        "cpu_s": round(total.cpu_s, 1),
        "load_average_start": load0,
        "load_average_end": load_average(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "cost_unit_requests": COST_UNIT_REQUESTS,
        "rate_card": cfg.cost.card().to_dict(),  # what every hosted figure was priced with
        **versions(loaded),
    }
    write_reports(results, out)
    return results


def _status(results: JSONObject) -> tuple[str, str]:
    """The run's status and why, following the run: a run a server stopped or SIGINT
    interrupted is never "complete", whatever the required metrics say."""
    missing = [r for r in results["required_metrics"] if r["required"] and not r["measured"]]
    unmeasured = (
        f"{len(missing)} required metric(s) not measured: "
        + "; ".join(f"{r['metric']} ({r['why'].rstrip('.')})" for r in missing)
        if missing
        else ""
    )
    if results["interrupted"]:
        kept = sum(1 for d in results["demos"].values() if d["status"] == "run")
        why = f"the run was interrupted (SIGINT) {results['interrupted']}; {kept} finished "
        return "interrupted", why + "demonstration(s) are kept" + (
            f"; {unmeasured}" if unmeasured else ""
        )
    if results.get("error"):
        lost = sum(1 for d in results["demos"].values() if d["status"] == "not measurable")
        return "stopped early", (
            f"a server stopped answering; {lost} demonstration(s) not measurable (see the "
            "server line below)"
        )
    if missing:
        return "incomplete", unmeasured
    return "complete", "every required metric of the selected demonstrations was measured"


def versions(loaded: LoadedModel) -> JSONObject:
    """What the opening summary names: the CPU, ctxlab's version and commit, torch's."""
    import subprocess

    import torch

    import ctxlab

    commit = ""
    root = Path(ctxlab.__file__).resolve().parents[1]
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        )  # fmt: skip
        if done.returncode == 0:
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True, text=True, timeout=5, check=False,
            )  # fmt: skip
            commit = done.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout else "")
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "cpu_model": _cpu_model(),
        "ctxlab_version": getattr(ctxlab, "__version__", ""),
        "git_commit": commit,
        "torch_version": str(torch.__version__),
        "engine": f"ctxlab engine {getattr(ctxlab, '__version__', '')}".strip(),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _run_demos(
    session: Session,
    only: set[int] | None,
    show: bool,
    through: ServerRun | None,
    server_part_only: bool = False,
) -> tuple[dict[str, DemoResult], str | None]:
    """Each demonstration in order, and where the run was interrupted (None: it was not).
    Through a server that stops answering, the one that was running and every later one are
    "not measurable" with that sentence; on SIGINT, the one that was running and every later
    one are "interrupted", and the finished ones are kept."""
    from ctxlab.probe.client import ServerGone
    from ctxlab.workshop.server_demos import not_measurable

    demos: dict[str, DemoResult] = {}
    interrupted = None
    for demo in REGISTERED:
        if only is not None and demo.number not in only:
            demos[demo.key] = DemoResult.of(demo, "not selected", "")
        elif interrupted is not None:
            demos[demo.key] = _interrupted(demo, f"not run: the run was interrupted {interrupted}")
        elif through is not None and through.gone is not None:
            demos[demo.key] = not_measurable(demo, f"not run: {through.gone}")
        else:
            try:
                demos[demo.key] = _one_demo(session, demo, show, through, server_part_only)
            except ServerGone as exc:
                assert through is not None
                gone = through.stop(f"in demonstration {demo.number}", exc)
                demos[demo.key] = not_measurable(demo, gone)
            except KeyboardInterrupt:
                interrupted = f"in demonstration {demo.number}"
                why = "interrupted (SIGINT) while it ran; its partial numbers are discarded"
                demos[demo.key] = _interrupted(demo, why.capitalize())
    return demos, interrupted


def _peer_passes(
    cfg: WorkshopConfig,
    session: Session,
    first: ServerLLM,
    servers: list[tuple[str, ServerLLM]],
    only: set[int] | None,
    show: bool,
) -> dict[str, JSONObject]:
    """Each further server of a `[[servers]]` list through the demonstrations that send it
    requests, so that every listed server is measured, not only probed. Each pass has a
    session of its own (the server's own page, its request backend, its files under
    `peers/N-label/`); its tables sit beside the first server's in the report and no
    prediction is judged on them (the predictions were written for the run's server).
    A demonstration whose server variant already compares every server side by side
    (`ServerMode.instead`) is not repeated. A server that stops answering ends its own pass
    with that sentence; the run goes on."""
    from ctxlab.workshop import server_run

    chosen = {
        d.number
        for d in REGISTERED
        if (only is None or d.number in only)
        and (d.server.uses_server or d.server.extra is not None)
        and not d.server.instead
    }
    peers: dict[str, JSONObject] = {}
    for i, (name, other) in enumerate(servers):
        if other is first or not chosen:
            continue
        folder = session.out / "peers" / f"{i + 1}-{re.sub(r'[^A-Za-z0-9._-]+', '-', name)}"
        folder.mkdir(parents=True, exist_ok=True)
        mine = Session(cfg, session.loaded, folder, quick=session.quick)
        chat = any(d.server.chat for d in REGISTERED if d.number in chosen)
        through = server_run.start(mine, other, chat, show, name, summarize=False)
        demos: dict[str, DemoResult] = {}
        if through.gone is None:
            demos, _ = _run_demos(mine, chosen, show, through, server_part_only=True)
        peers[name] = {
            "label": other.label(code=True),
            "engine": other.info.engine,
            "error": through.gone or "",
            "demos": {k: d.to_json(session.out) for k, d in demos.items() if d.number in chosen},
        }
    return peers


def _interrupted(demo: Demonstration[BaseModel], why: str) -> DemoResult:
    res = DemoResult.of(demo, "interrupted")
    res.summary = why.rstrip(".") + "."
    res.notes.append(res.summary)
    return res


def _one_demo(
    session: Session,
    demo: Demonstration[BaseModel],
    show: bool,
    through: ServerRun | None,
    server_part_only: bool = False,
) -> DemoResult:
    """`demo` on the local engine, or through the run's server as its `ServerMode` says:
    not measurable when the server lacks what it needs, its variant instead of `run`, its
    extra after `run` (`server_part_only`: the extra alone, for a further server's pass:
    the local part is the first pass's); every table titled with where its numbers came
    from."""
    from ctxlab.workshop.server_demos import not_measurable

    mode = demo.server
    label = f"demonstration {demo.number}/{len(REGISTERED)}: {demo.title}"
    if through is not None:
        why = through.cannot(demo.server)
        if why is not None:
            return not_measurable(demo, why)
    if through is not None and mode.variant is not None:
        with progress(f"{label} on {through.server.label()}", enabled=show), Timer() as t:
            res = mode.variant(session, through)
    elif through is not None and mode.extra is not None and server_part_only:
        with progress(f"{label} on {through.server.label()}", enabled=show), Timer() as t:
            res = DemoResult.of(demo)
            mode.extra(session, through, res)
    else:
        with progress(label, demo.steps(session), enabled=show) as tracker, Timer() as t:
            res = demo.run(session, tracker)
        if through is not None and mode.extra is not None:
            where = f"{label} on {through.server.label()}"
            with progress(where, enabled=show), Timer() as t2:
                mode.extra(session, through, res)
            t.wall_s, t.cpu_s = t.wall_s + t2.wall_s, t.cpu_s + t2.cpu_s
    res.wall_s, res.cpu_s = t.wall_s, t.cpu_s
    if through is not None:
        _name_the_server(res, demo, through.label)
    if through is not None and mode.chat and res.status == "run":
        res.notes.append(
            f"Every model call went to the chat API of {through.label} "
            "(`/v1/chat/completions`: its own chat template and model); budgets were "
            "counted with the local tokenizer, checked first against the server's count "
            "of a test chat; reused tokens are the server's cached_tokens."
        )
    return res


def _name_the_server(res: DemoResult, demo: Demonstration[BaseModel], label: str) -> None:
    through = demo.server.uses_server
    where = f"through {label}" if through else "on the local engine, not the server"
    for table in res.tables:
        if label not in table.title:
            table.title = f"{table.title} ({where})"
        if through and "read from the pool" in table.note:
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
    """Every prediction of a selected demonstration judged; a timing measured once (no
    repeats, no interval of its own) is read against the largest scatter of repeated timings
    in this run, since the same machine produced both: a change smaller than that is within
    noise, never held."""
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
        if demo.status == "not selected":
            continue  # `--only` left it out: its predictions are not about this run
        for metric, p in predictions.items():
            if demo.status == "not measurable":
                out.append(judge(demo.number, key, metric, p, None, demo.summary))
                continue
            if demo.status != "run":
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


def _required(
    cfg: WorkshopConfig, demos: dict[str, DemoResult], only: set[int] | None, served: bool
) -> list:
    rows = []
    for ref in cfg.required_metrics:
        found = metric_ref(ref)
        assert not isinstance(found, str)  # the config checked every name
        demo_spec, metric = found
        demo = demos[demo_spec.key]
        # A demonstration a server cannot run is not required of that run; its verdicts
        # and the report say why. On the local engine "not measurable" (a config the
        # model cannot run) leaves its required metrics missing: the run is incomplete.
        through = served and demo.status == "not measurable"
        selected = (only is None or demo_spec.number in only) and not through
        obs = demo.observations.get(metric.name)
        measured = obs is not None and obs.measurable
        if through:
            why = demo.summary
        elif not selected:
            why = "not selected with --only"
        elif demo.status == "not measurable":
            why = demo.summary or f"demonstration {demo.number} was not measurable"
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
    write_text(paths["results"], json.dumps(results, indent=1) + "\n")  # whole or absent
    stored = json.loads(paths["results"].read_text(encoding="utf-8"))
    blocks = build_document(stored)
    write_text(paths["markdown"], render_markdown(blocks))
    write_text(paths["html"], render_html(blocks, out))
    return paths


def mark_superseded(out: Path, started: float) -> bool:
    """After a run interrupted before it wrote its report: mark the older report in `out`
    (one this run did not write) as not this run's, so it is not read as the new one's.
    Whether there was one to mark."""
    from datetime import datetime as dt

    when = dt.fromtimestamp(started, UTC).isoformat(timespec="seconds")
    line = (
        f"**Superseded**: a later run in this folder, started {when}, was interrupted "
        "before it wrote its report; this report is from an earlier run."
    )
    marked = False
    for name, head in (("report.md", f"> {line}\n\n"), ("report.html", f"<p>{line}</p>\n")):
        path = out / name
        try:
            if path.stat().st_mtime >= started:
                continue
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if "**Superseded**" in text[:1000]:
            marked = True
            continue
        if name == "report.html" and "<body>" in text:
            text = text.replace("<body>", "<body>\n" + head.replace("**", ""), 1)
        else:
            text = head + text
        write_text(path, text)
        marked = True
    return marked
