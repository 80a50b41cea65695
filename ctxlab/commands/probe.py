"""`ctxlab probe`: measure a deployment's cache from outside (prefix caching and its
granularity, cache_salt isolation, capacity, a step-time profile for the simulator).

Nothing here imports torch: the probe runs where no model is installed, against vLLM,
SGLang, llama.cpp's server or `ctxlab serve`. Exit codes: 0 done (a section the budget
could not pay for is listed as not run), 2 a user mistake or a server that refused the
probe before it measured anything (unreachable, wrong key, not OpenAI-compatible, unknown
model), 3 the server stopped answering, or answered something the probe cannot use (a
malformed stream, a field of the wrong type, an HTTP error), after the calibration: the
report with the finished sections, and the failing one marked with the reason, is still
written. `--kv-events` off loopback, or without pyzmq/msgpack, is exit 2 before anything is
sent; an endpoint where nothing publishes costs the probe nothing (the events figure says
no events arrived).
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ctxlab.commands.options import JsonOpt, output_file
from ctxlab.json_output import dumps
from ctxlab.outputs import write_text

if TYPE_CHECKING:
    from ctxlab.probe.report import ProbeReport

DEFAULT_OUT = Path("out/probe/probe.json")


def register(app: typer.Typer) -> None:
    @app.command("probe")
    def probe(
        server: str = typer.Option(
            ..., "--server", help="Server root, e.g. http://127.0.0.1:8000 (/v1 optional)."
        ),
        api_key: str = typer.Option(
            None, "--api-key", help="Bearer key for the server (never written to the report)."
        ),
        model: str = typer.Option(
            None, "--model", help="Model name the server expects (default: its only model)."
        ),
        out: Path = typer.Option(
            DEFAULT_OUT, "--out", help="Report JSON; the step profile is written beside it."
        ),
        sections: str = typer.Option(
            "prefix,isolation,capacity,profile",
            "--sections",
            help="Comma list of prefix, isolation, capacity, profile (capacity needs prefix, or "
            "a block size the server publishes in /metrics).",
        ),
        max_requests: int = typer.Option(
            1000, "--max-requests", help="Most requests the probe sends."
        ),
        max_tokens: int = typer.Option(
            400_000, "--max-tokens", help="Most prompt tokens the probe sends."
        ),
        max_seconds: float = typer.Option(
            900.0, "--max-seconds", help="Total seconds: no request waits beyond them."
        ),
        longest: int = typer.Option(
            300, "--longest", help="Longest divergence position of the staircase (tokens)."
        ),
        full: bool = typer.Option(
            False, "--full", help="The longer step-time design (more lengths and batch sizes)."
        ),
        arch: str = typer.Option(
            None,
            "--arch",
            help="The served model's architecture for the planner's prediction of the pool "
            "(a preset, config.json or GGUF file; default: the folder the server loaded when "
            "it is on this machine, else the preset of the served name).",
        ),
        kv_events: str = typer.Option(
            None,
            "--kv-events",
            help="The server's KV-event publisher on this machine (vLLM --kv-events-config, "
            "ctxlab serve --kv-events-endpoint), e.g. tcp://127.0.0.1:5557: its capacity from "
            "the events beside the others, and a residency timeline beside the report.",
        ),
        yes: bool = typer.Option(
            False, "--yes", help="No 5 s pause after the printed plan on a terminal."
        ),
        as_json: JsonOpt = False,
    ) -> None:
        """Measure a server's prefix cache from outside: on/off and page size, cache_salt
        isolation, capacity, and a step profile for `ctxlab simulate --profile`. Probe only
        deployments you operate: the capacity test evicts other users' cached prefixes."""
        from rich.console import Console

        from ctxlab.peer.key import check_key
        from ctxlab.probe.runner import ProbeConfig, run
        from ctxlab.progress import progress

        output_file(out, ".json")
        check_key(
            api_key
        )  # a key with a space, a break or non-ASCII: one sentence, the key unshown
        cfg = ProbeConfig(
            server=server, model=model, api_key=api_key,
            sections=tuple(s for s in sections.replace(" ", "").split(",") if s),
            max_requests=max_requests, max_tokens=max_tokens, max_seconds=max_seconds,
            longest=longest, quick=not full, arch=arch, kv_events=kv_events,
        ).check()  # fmt: skip
        console = Console(stderr=True)
        bars: list = []  # the progress bar starts once the server answered (so a bad URL
        # or key is one line, not a bar and then a line)

        def announce(info, plan) -> None:
            console.print(f"probing {info.label()}")
            console.print(
                f"it will send at most {plan['total requests (at most)']:,} requests and "
                f"{plan['total prompt tokens (at most)']:,} prompt tokens within "
                f"{cfg.max_seconds:g} s (--max-requests, --max-tokens, --max-seconds cap them)"
            )
            if "capacity" in cfg.sections:
                console.print(
                    "the capacity test fills the cache until it evicts: other users' cached "
                    "prefixes on this server are evicted too. Probe only deployments you operate."
                )
            if not yes and sys.stdin.isatty():
                console.print("starting in 5 s (Ctrl-C cancels; --yes skips this pause)")
                time.sleep(5)
            bars.append(stack.enter_context(progress("probing", total=None)))

        def step(msg: str) -> None:
            if bars:
                bars[0].advance()
                bars[0].describe(msg)

        with contextlib.ExitStack() as stack:
            report = run(cfg, step, announce)
        doc = report.document()
        profile = doc["details"].pop("profile", None)
        if profile is not None and len(profile["steps"]) >= 5:
            path = out.with_name(out.stem + "-step-profile.json")
            write_text(path, dumps(profile, indent=1) + "\n", "--out")
            doc["profile_file"] = str(path)
        if report.residency is not None:
            doc["residency_file"] = _residency(report, out)
        write_text(out, dumps(doc, indent=1) + "\n", "--out")
        if as_json:
            typer.echo(dumps(doc))  # strict JSON: a NaN a server sent is null
        else:
            _tables(Console(), doc, out)
        if report.error:
            typer.echo(f"error: {report.error}; partial results in {out}", err=True)
            raise typer.Exit(3)


def _tables(console, doc: dict, out: Path) -> None:
    from rich.table import Table

    s = doc["server"]
    ver = f" {s['version']}" if s["version"] else ""
    model = s["model"].rsplit("/", 1)[-1] if len(s["model"]) > 48 else s["model"]
    where = f"{s['engine']}{ver} at {s['url']}, model {model}"
    console.print(f"server: {where}")
    if doc["token_rule"]:
        console.print(f"tokens: {doc['token_rule']}")
    for section, figures in doc["sections"].items():
        table = Table(title=f"{section} ({where})", title_justify="left")
        for col in ("figure", "value", "how", "evidence"):
            table.add_column(col, justify="right" if col == "value" else "left")
        for f in figures:
            from ctxlab.probe.figures import Figure

            table.add_row(f["name"], Figure(**f).shown(), f["how"], f["note"])
        console.print(table)
    for f in doc["sections"].get("capacity", []):
        if f["name"] == "capacity: which figure disagrees":
            console.print(f"capacity, predicted / published / measured: {f['note']}", markup=False)
    for section, why in doc["failed"].items():
        console.print(f"failed: {section}: {why}", markup=False)
    for section, why in doc["not_run"].items():
        console.print(f"not run: {section}: {why}")
    missing = doc["details"].get("profile missing") or []
    for m in missing:
        console.print(f"profile: not measured: {m}")
    sent = doc["sent"]
    console.print(
        f"sent {sent.get('requests', 0):,} requests, {sent.get('prompt tokens', 0):,} prompt tokens"
    )
    if doc["profile_file"]:
        console.print(f"step profile: {doc['profile_file']} (ctxlab simulate --profile)")
        command = simulate_command(s["model"], doc["profile_file"])
        console.print(f"simulate this deployment: {command}", soft_wrap=True, markup=False)
    if doc.get("residency_file"):
        console.print(f"KV residency (events): {doc['residency_file']} and its .png")
    console.print(f"report: {out}")


def _residency(report: ProbeReport, out: Path) -> str:
    """The residency timeline from the KV events, as `ctxlab watch` writes it, beside the
    report (JSON and PNG); the JSON's path."""
    from ctxlab.kvevents.plot import plot_residency

    res = report.residency
    assert res is not None
    path = out.with_name(out.stem + "-residency.json")
    body = {**report.details.get("kv events", {}), **res.to_json()}
    write_text(path, dumps(body, indent=1) + "\n", "--out")
    plot_residency(res, path.with_suffix(".png"), f"KV events while probing {report.server.url}")
    return str(path)


def simulate_command(model: str, profile: str) -> str:
    """The `ctxlab simulate` command for a probed deployment: its profile sets the page, the
    pool and the step prices; the architecture is the served model's preset where its name
    is one, else a placeholder the user fills in (a preset, --config or --gguf)."""
    import shlex

    from ctxlab.arch.presets import PRESETS

    arch = model.lower() if model.lower() in PRESETS else "ARCH"
    cmd = (
        f'ctxlab simulate "synthetic:n=200,rate=1,seed=1" {arch} --profile '
        f"{shlex.quote(profile)} --out out/simulate-probe"
    )
    if arch == "ARCH":
        cmd += f" (ARCH: {model}'s preset, --config config.json or --gguf file)"
    return cmd
