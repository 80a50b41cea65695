"""`ctxlab workshop [CONFIG.toml]`: the registered demonstrations, one report (`make run`).

The config is read and checked before the model loads (a mistake costs a second, not a
model load); torch and the model are imported inside the command so `ctxlab --help` stays
fast. The exit codes are listed in the command's `--help` (its docstring).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from ctxlab.commands.options import JsonOpt, input_file, output_dir
from ctxlab.errors import CtxlabError

DEFAULT_OUT = Path("out/workshop")


def parse_only(text: str | None) -> set[int] | None:
    """'1,3,6' -> {1, 3, 6}; every number must name one of the registered demonstrations."""
    if text is None:
        return None
    from ctxlab.workshop.registry import BY_NUMBER

    picked: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        # isdecimal, not isdigit: '²' is a digit to Python but no number int() reads
        if not (part.isascii() and part.isdecimal()) or int(part) not in BY_NUMBER:
            raise CtxlabError(
                f"--only {text!r}: {part!r} is not a demonstration number (1 to {len(BY_NUMBER)})."
            )
        picked.add(int(part))
    if not picked:
        raise CtxlabError("--only names no demonstration; e.g. --only 1,3,6.")
    return picked


def _preflight(cfg: Any, only: set[int] | None) -> None:
    """Files the selected demonstrations' sections name are read now, before the model
    loads (each demonstration's `preflight`)."""
    from ctxlab.workshop.registry import REGISTERED

    for demo in REGISTERED:
        if demo.preflight is not None and (only is None or demo.number in only):
            demo.preflight(demo.config(cfg))


def register(app: typer.Typer) -> None:
    @app.command("workshop")
    def workshop(
        config: Path = typer.Argument(
            None,
            help="Experiment config (TOML); keys left out keep the embedded default.",
            metavar="CONFIG.toml",
            show_default=False,
        ),
        out: Path = typer.Option(
            DEFAULT_OUT,
            "--out",
            help="Folder for report.md, report.html, results.json, plots.",
            metavar="DIR",
        ),
        quick: bool = typer.Option(
            False, "--quick", help="The same demonstrations at the config's \\[quick] sizes (CI)."
        ),
        full: bool = typer.Option(
            False,
            "--full",
            help="The config's \\[full] samples: what the default run leaves out to fit ten "
            "minutes (more answered questions; see --print-config).",
        ),
        only: str = typer.Option(
            None,
            "--only",
            help="Run only these demonstrations, e.g. 1,3,6 (skips the eval).",
            metavar="N,N",
        ),
        server: str = typer.Option(
            None,
            "--server",
            help="Measure through this OpenAI-compatible server (root URL, no /v1); it "
            "replaces the config's servers list; see docs/deployment.md.",
        ),
        api_key: str = typer.Option(None, "--api-key", help="Bearer key for --server."),
        server_model: str = typer.Option(
            None, "--server-model", help="Model name --server expects (default: its only one)."
        ),
        server_timeout: float = typer.Option(
            None,
            "--server-timeout",
            help="Seconds one request to a server may take in total (default 600; overrides "
            "each \\[\\[servers]] entry's timeout).",
            metavar="SECONDS",
        ),
        print_config: bool = typer.Option(
            False, "--print-config", help="Print the default config, commented, and exit."
        ),
        as_json: JsonOpt = False,
    ) -> None:
        """Run the workshop: predictions, the demonstrations, one report with verdicts.

        Exit codes: 0 every required metric was measured; 1 the run is incomplete (the
        report says which metric and why); 2 a bad config or flag; 3 a server stopped
        answering mid-run (the report keeps what was measured before); 130 interrupted
        (Ctrl-C, SIGINT: the report keeps the finished demonstrations and says
        "interrupted"; an older report in --out that this run did not replace is marked).
        """
        from ctxlab.workshop.config_file import load_config
        from ctxlab.workshop.default_config import DEFAULT_TOML

        if print_config:
            typer.echo(DEFAULT_TOML, nl=False)
            return
        from ctxlab.peer.key import check_key

        picked = parse_only(only)
        timeout = check_timeout(server_timeout)
        check_key(
            api_key
        )  # a key with a space, a break or non-ASCII: one sentence, the key unshown
        if config is not None:
            input_file(config, "the workshop config", "TOML file")
        cfg = load_config(config, quick=quick, full=full)
        _preflight(cfg, picked)
        folder = output_dir(out)
        label = str(config) if config is not None else "the embedded default config"
        label += " at its [full] sizes" if full else ""
        started = time.time()
        try:
            results = _run(
                cfg, folder, quick, picked, label, (server, api_key, server_model, timeout)
            )
        except KeyboardInterrupt:
            from ctxlab.workshop.runner import mark_superseded

            marked = mark_superseded(folder, started)
            typer.echo(
                "error: interrupted (SIGINT) before the run wrote its report"
                + (f"; the older report in {folder} is marked as such" if marked else "")
                + ".",
                err=True,
            )
            raise typer.Exit(130) from None
        report = folder / results["files"]["markdown"]
        if as_json:
            typer.echo(
                json.dumps(
                    {
                        "status": results["status"],
                        "status_reason": results["status_reason"],
                        "verdict_counts": results["verdict_counts"],
                        "wall_s": results["run"]["wall_s"],
                        "cpu_s": results["run"]["cpu_s"],
                        "report": str(report),
                        "html": str(folder / results["files"]["html"]),
                        "results": str(folder / results["files"]["results"]),
                    }
                )
            )
        else:
            _print_summary(results, folder)
        if results.get("interrupted"):
            typer.echo(f"error: {results['status_reason']} ({report}).", err=True)
            raise typer.Exit(130)
        if results.get("error"):
            typer.echo(f"error: {results['error']} ({folder}).", err=True)
            raise typer.Exit(3)
        if results["status"] != "complete":
            typer.echo(f"error: the run is incomplete: {results['status_reason']}.", err=True)
            raise typer.Exit(1)


def check_timeout(seconds: float | None) -> float | None:
    """--server-timeout as given (None: each server's own, else 600 s), or one sentence."""
    from ctxlab.inputs.numbers import check_positive
    from ctxlab.workshop.config_servers import timeout_error

    if seconds is None:
        return None
    check_positive(seconds, "--server-timeout")  # nan, inf, 0: the sentence every option gives
    try:
        return timeout_error(seconds)
    except ValueError as exc:
        raise CtxlabError(f"--server-timeout {seconds:.12g}: {exc}.") from None


def _run(
    cfg: Any,
    folder: Path,
    quick: bool,
    picked: set[int] | None,
    label: str,
    flags: tuple[str | None, str | None, str | None, float | None],
) -> dict:
    """The run itself: on the local engine, or through `--server` / the config's servers.
    `flags`: --server, --api-key, --server-model, --server-timeout."""
    from ctxlab.workshop.config_servers import DEFAULT_TIMEOUT
    from ctxlab.workshop.runner import run_workshop

    server, api_key, server_model, timeout = flags
    listed: Listed = [  # --server replaces the config's list; --server-timeout every timeout
        (s.label, s.url, s.api_key, s.model, timeout or s.timeout or DEFAULT_TIMEOUT)
        for s in cfg.servers
    ]
    if server is not None:
        listed = [("server", server, api_key, server_model, timeout or DEFAULT_TIMEOUT)]
    if listed:
        from ctxlab.workshop.runner import load_default_model

        _each(listed, _check_server)  # a bad URL, key or model costs a second, not a load
        loaded = load_default_model(cfg)
        backends = _connect(listed, loaded)
        if server is None:  # the config's servers: each one's KV-event publisher, if given
            for (_, backend), entry in zip(backends, cfg.servers, strict=True):
                backend.kv_events = entry.kv_events
        try:
            return run_workshop(
                cfg, folder, quick=quick, only=picked, config_label=label, loaded=loaded,
                server=backends[0][1], servers=backends,
            )  # fmt: skip
        finally:
            for _, b in backends:
                b.close()
    return run_workshop(cfg, folder, quick=quick, only=picked, config_label=label)


Listed = list[tuple[str, str, str | None, str | None, float]]  # label, url, key, model, timeout


def _each(listed: Listed, do: Any) -> list:
    """`do(url, key, model, timeout)` for every server; a failure is one sentence naming the
    server's label (`[[servers]]`) or none (`--server`)."""
    out = []
    for name, url, key, model, timeout in listed:
        try:
            out.append((name, do(url, key, model, timeout)))
        except CtxlabError as exc:
            if len(listed) == 1 and name == "server":
                raise
            raise CtxlabError(f"[[servers]] {name!r}: {exc}") from None
    return out


def _check_server(url: str, key: str | None, model: str | None, timeout: float) -> None:
    """Reach the server and read its model list (the checks `ServerLLM.connect` repeats)."""
    from ctxlab.probe.client import Budget, ProbeClient
    from ctxlab.probe.identify import check_url, identify

    seconds = min(30.0, timeout)
    client = ProbeClient(check_url(url), model or "", key, Budget(1, 1), timeout=seconds)
    try:
        identify(client, model)
    finally:
        client.close()


def _connect(listed: Listed, loaded: Any) -> list:
    """Wrap every server for the run (`ServerLLM`), before anything is measured."""
    from ctxlab.workshop.server_backend import ServerLLM

    tok, vocab = loaded.tokenizer, loaded.config.vocab_size
    return _each(
        listed,
        lambda url, key, model, timeout: ServerLLM.connect(url, key, model, tok, vocab, timeout),
    )


def _print_summary(results: dict, folder: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from ctxlab.workshop.result import fmt

    console = Console()
    table = Table(title="predictions against observations", title_justify="left")
    for col in ("demo", "metric", "predicted", "baseline", "observed", "verdict"):
        table.add_column(col, justify="right" if col in ("baseline", "observed") else "left")
    style = {
        "held": "green",
        "failed": "bold red",
        "within noise": "cyan",
        "not measurable": "yellow",
    }
    for v in results["verdicts"]:
        d = v["digits"]
        table.add_row(
            str(v["demo"]),
            v["metric"],
            v["direction"],
            fmt(v["baseline"], d),
            fmt(v["observed"], d),
            f"[{style[v['verdict']]}]{v['verdict']}[/]",
        )
    console.print(table)
    c, run = results["verdict_counts"], results["run"]
    console.print(
        f"{c['held']} held, {c['failed']} failed, {c['not measurable']} not measurable; "
        f"wall {run['wall_s']:.0f} s, CPU {run['cpu_s']:.0f} s, load average at the end "
        f"{' / '.join(f'{x:.2f}' for x in run['load_average_end'])}"
    )
    status = results["status"]
    colour = "green" if status == "complete" else "bold red"
    console.print(f"[{colour}]status: {status}[/] ({results['status_reason']})")
    console.print(f"report: {folder / results['files']['markdown']}")
    console.print(f"        {folder / results['files']['html']} (self-contained)")
    console.print(f"        {folder / results['files']['results']} (every number)")
