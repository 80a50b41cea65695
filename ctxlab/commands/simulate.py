"""`ctxlab simulate`: replay a trace on an architecture and device, print latency and reuse.

Nothing here imports torch (`--calibrate` runs `ctxlab.sim.calibration_run`, which loads the
engine when called); matplotlib is imported only when plots are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ctxlab.commands.options import (
    DEFAULT_MODEL,
    ConfigOpt,
    DeviceBandwidthOpt,
    DeviceFlopsOpt,
    DeviceMemoryOpt,
    DeviceOpt,
    GgufOpt,
    GpusOpt,
    JsonOpt,
    ModelOpt,
    PageSizeOpt,
    PresetArg,
    ReserveBytesOpt,
    SeedOpt,
    WeightsBytesOpt,
    device_from_flags,
    input_file,
    one_source,
    output_dir,
)
from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_positive
from ctxlab.json_output import dumps
from ctxlab.progress import progress
from ctxlab.sim.slo import DEFAULT_ATTAINMENT

if TYPE_CHECKING:
    from rich.console import Console

    from ctxlab.sim.slo import RateAnswer

_HEADLINE = (
    ("requests_completed", "requests completed", "{:,.0f}"),
    ("reused_token_fraction", "reused token fraction", "{:.3f}"),
    ("reused_tokens", "reused tokens", "{:,.0f}"),
    ("queried_tokens", "queried tokens", "{:,.0f}"),
    ("computed_tokens", "computed tokens (queried - reused)", "{:,.0f}"),
    ("recomputed_tokens", "recomputed tokens (preemption)", "{:,.0f}"),
    ("reused_from_tier_tokens", "reused from host tier", "{:,.0f}"),
    ("hit_requests", "requests with a hit", "{:,.0f}"),
    ("evictions", "evicted blocks", "{:,.0f}"),
    ("preemptions", "preemptions", "{:,.0f}"),
    ("peak_running_requests", "peak running requests", "{:,.0f}"),
    ("throughput_tokens_per_s", "output tokens / s", "{:,.1f}"),
    ("throughput_requests_per_s", "requests / s", "{:,.3f}"),
    ("goodput_requests_per_s", "goodput (requests in SLO / s)", "{:,.3f}"),
    ("makespan_s", "simulated time (s)", "{:,.1f}"),
)
_LATENCY = ("ttft", "tpot", "itl", "e2e", "queue")


def _bytes(value: str | None, what: str) -> int | None:
    from ctxlab.plan.units import parse_bytes

    return None if value is None else parse_bytes(value, what)


def _given(ctx: typer.Context) -> set[str]:
    """The engine options the user gave on the command line (a profile fills the others)."""
    flags = ("--page-size", "--pool-bytes", "--max-running", "--chunk-tokens")
    given = set()
    for flag in flags:
        source = ctx.get_parameter_source(flag[2:].replace("-", "_"))
        if source is not None and source.name != "DEFAULT":  # typer's own click copy's enum
            given.add(flag)
    return given


def _latency_table(console, title: str, rows: list[tuple[str, dict]]) -> None:
    from rich.table import Table

    table = Table(title=title)
    if len(rows) > 1:
        table.add_column("run")
    table.add_column("latency (s)")
    for head in ("p50", "p95", "p99", "mean"):
        table.add_column(head, justify="right")
    for label, m in rows:
        for name in _LATENCY:
            cells = [f"{m[f'{name}_{q}']:.4g}" for q in ("p50", "p95", "p99", "mean")]
            lead = [label] if len(rows) > 1 else []
            table.add_row(*lead, name.upper(), *cells)
    console.print(table)


def register(app: typer.Typer) -> None:
    @app.command()
    def simulate(
        ctx: typer.Context,
        trace: str | None = typer.Argument(
            None,
            help="A Mooncake .jsonl or a .csv trace, or synthetic:key=value,... "
            "(docs/simulate.md).",
            metavar="TRACE",
            show_default=False,
        ),
        preset: PresetArg = None,
        arch_alias: str | None = typer.Option(None, "--arch", hidden=True),
        config: ConfigOpt = None,
        gguf: GgufOpt = None,
        device: DeviceOpt = "h100",
        device_flops: DeviceFlopsOpt = None,
        device_bandwidth: DeviceBandwidthOpt = None,
        device_memory: DeviceMemoryOpt = None,
        gpus: GpusOpt = None,
        weights_bytes: WeightsBytesOpt = None,
        reserve_bytes: ReserveBytesOpt = None,
        page_size: PageSizeOpt = 16,
        chunk_tokens: int = typer.Option(
            2048, "--chunk-tokens", help="Token budget per step (chunked prefill)."
        ),
        max_running: int = typer.Option(256, "--max-running", help="Most requests at once."),
        pool_bytes: str | None = typer.Option(
            None,
            "--pool-bytes",
            help="KV pool size, e.g. 40GiB (default: what the device "
            "leaves after weights and reserve).",
        ),
        unlimited_cache: bool = typer.Option(
            False, "--unlimited-cache", help="A pool that never fills."
        ),
        offload_bytes: str | None = typer.Option(
            None, "--offload-bytes", help="Host offload tier size, e.g. 256GiB."
        ),
        offload_bandwidth: float = typer.Option(
            25e9, "--offload-bandwidth", help="Host tier bytes/s."
        ),
        offload_latency: float = typer.Option(
            0.0, "--offload-latency", help="Seconds each restore from the host tier costs first."
        ),
        disaggregated: bool = typer.Option(
            False, "--disaggregated", help="Separate prefill and decode instances."
        ),
        prefill_gpus: int = typer.Option(
            1, "--prefill-gpus", help="--disaggregated: devices of the prefill instance."
        ),
        kv_transfer_bandwidth: float = typer.Option(
            50e9, "--kv-transfer-bandwidth", help="--disaggregated: prefill->decode KV bytes/s."
        ),
        slo_ttft: float = typer.Option(2.0, "--slo-ttft", help="TTFT SLO (s) for goodput."),
        slo_tpot: float = typer.Option(0.1, "--slo-tpot", help="TPOT SLO (s) for goodput."),
        slo_attainment: float = typer.Option(
            DEFAULT_ATTAINMENT,
            "--slo-attainment",
            help="Share of requests that must meet both SLOs for a rate to count as meeting "
            "them (read by --sweep trace-time-scale=..., which names the highest such rate).",
        ),
        trace_time_scale: float = typer.Option(
            1.0,
            "--trace-time-scale",
            help="Multiply the trace's arrival times (0.5 = offered twice as fast), as bench "
            "serve does; --sweep trace-time-scale=2,1,0.5,0.25 finds the highest rate that "
            "meets the SLO.",
        ),
        compute_efficiency: float = typer.Option(
            0.5, "--compute-efficiency", help="Share of peak FLOP/s reached."
        ),
        memory_efficiency: float = typer.Option(
            0.8, "--memory-efficiency", help="Share of memory bandwidth reached."
        ),
        step_overhead: float = typer.Option(
            0.0005, "--step-overhead", help="Fixed seconds per step."
        ),
        profile: Path | None = typer.Option(
            None, "--profile", help="Measured step-time profile JSON (from ctxlab profile)."
        ),
        step_scale: float = typer.Option(
            1.0,
            "--step-scale",
            help="Multiply every step's time (roofline or profile): how far the prediction "
            "moves if the step price is off, e.g. --sweep step-scale=0.95,1,1.05.",
        ),
        hash_block: int = typer.Option(
            512, "--hash-block", min=1, help="Tokens per trace hash id (Mooncake: 512)."
        ),
        sweep: str | None = typer.Option(
            None,
            "--sweep",
            help="PARAM=v1,v2,...: pool-bytes, page-size, chunk-tokens, offload-bytes, "
            "step-scale or trace-time-scale (the offered rate: the highest one meeting the SLO "
            "is named).",
        ),
        calibrate: bool = typer.Option(
            False,
            "--calibrate",
            help="Run a generated trace on the real engine and here; compare latencies.",
        ),
        requests: int = typer.Option(
            24, "--requests", help="--calibrate: requests in the generated trace."
        ),
        seed: SeedOpt = 0,
        rate: float | None = typer.Option(
            None,
            "--rate",
            help="--calibrate: arrivals/s (default: 1.5 x solo capacity, from the profile).",
        ),
        model: ModelOpt = DEFAULT_MODEL,
        threads: int = typer.Option(1, "--threads", help="--calibrate: torch threads (pinned)."),
        out: Path = typer.Option(
            Path("out/simulate"),
            "--out",
            help="Folder for the PNG plots (--calibrate: out/calibrate).",
        ),
        as_json: JsonOpt = False,
    ) -> None:
        """Replay a trace: TTFT/TPOT/ITL percentiles, reused tokens, evictions, preemptions."""
        from ctxlab.sim.bounds import fit_to_context
        from ctxlab.sim.config import SimConfig, fewest_gpus, resolve
        from ctxlab.sim.run import simulate as run_sim
        from ctxlab.sim.slo import SweptRate, highest_rate
        from ctxlab.sim.sweep import parse_sweep, sweep_configs
        from ctxlab.sim.trace import load_trace

        if not 0 < slo_attainment <= 1:
            raise CtxlabError(
                f"--slo-attainment is a share of requests in (0, 1], got {slo_attainment}"
            )
        if calibrate:
            if rate is not None:
                check_positive(rate, "--rate")
            _calibrate(requests, seed, profile, model, threads, rate, out, as_json)
            return
        if trace is None:
            raise CtxlabError("give a TRACE (a .jsonl, a .csv or synthetic:...) or --calibrate")
        if arch_alias is not None and preset is not None:
            raise CtxlabError("give the preset once: as the second argument or with --arch.")
        preset = preset if preset is not None else arch_alias
        if preset is None and config is None and gguf is None:
            raise CtxlabError(
                "give an architecture after the trace: a preset name (e.g. llama-3.1-8b), "
                "--config config.json or --gguf file"
            )
        output_dir(out)
        if profile is not None:
            input_file(profile, "--profile", "step-profile JSON file")
        (spec,) = one_source(preset, config, gguf)
        dev = device_from_flags(device, device_flops, device_bandwidth, device_memory)
        cfg = SimConfig(
            page_size=page_size,
            chunk_tokens=chunk_tokens,
            max_running=max_running,
            pool_bytes=_bytes(pool_bytes, "--pool-bytes"),
            unlimited=unlimited_cache,
            weights_bytes=_bytes(weights_bytes, "--weights-bytes"),
            reserve_bytes=_bytes(reserve_bytes, "--reserve-bytes"),
            offload_bytes=_bytes(offload_bytes, "--offload-bytes") or 0,
            offload_bandwidth=offload_bandwidth,
            offload_latency=offload_latency,
            disaggregated=disaggregated,
            prefill_gpus=prefill_gpus,
            kv_transfer_bandwidth=kv_transfer_bandwidth,
            slo_ttft=slo_ttft,
            slo_tpot=slo_tpot,
            compute_efficiency=compute_efficiency,
            memory_efficiency=memory_efficiency,
            step_overhead=step_overhead,
            profile=None if profile is None else str(profile),
            step_scale=step_scale,
            time_scale=trace_time_scale,
        )
        measured_on = None
        if profile is not None:
            from ctxlab.sim.profile_engine import apply_profile_engine, read_profile_engine

            eng = read_profile_engine(str(profile))
            cfg, taken = apply_profile_engine(cfg, spec, eng, _given(ctx))
            measured_on = eng.device
            for line in taken:
                typer.echo(f"from the profile: {line}", err=True)
        chosen = gpus is None
        cfg = cfg.with_(gpus=fewest_gpus(spec, dev, cfg) if gpus is None else gpus)
        resolve(spec, dev, cfg)  # weights that do not fit: one sentence before any work
        if cfg.disaggregated:
            resolve(spec, dev, cfg, gpus=cfg.prefill_gpus)
        if profile is not None:
            from ctxlab.sim.steptime import ProfileStepTime

            ProfileStepTime(profile)  # every step checked before the trace is read
        runs = [("run", cfg)]
        sweep_name = None
        if sweep:
            sweep_name, values = parse_sweep(sweep)
            runs = list(sweep_configs(cfg, sweep_name, values))
        with progress("reading the trace"):
            tr = load_trace(trace, block_tokens=hash_block)  # every line checked first
        tr, clamped = fit_to_context(tr, spec)
        if clamped is not None:
            typer.echo(f"note: {clamped}", err=True)
        offered = tr.offered_rate
        if sweep_name == "trace-time-scale" and offered is None:
            raise CtxlabError(
                f"every request of {tr.name} arrives at once, so a time scale offers no rate; "
                "sweep trace-time-scale on a trace with arrival times (a Mooncake slice, or "
                "synthetic:...,rate=R)."
            )
        results = []
        with progress(f"simulating {len(tr):,} requests", total=len(runs)) as bar:
            for label, run_cfg in runs:
                results.append((label, run_sim(tr, spec, dev, run_cfg)))
                bar.advance()
        gpus_note = " (the fewest that hold the weights)" if chosen and cfg.gpus > 1 else ""
        where = (
            f"steps measured on {measured_on}"
            if measured_on
            else f"{cfg.gpus} x {dev.name}{gpus_note}"
        )
        title = f"{tr.name}: {spec.name} ({spec.cache_dtype_bytes:g}-byte cache) on {where}"
        slo = f"TTFT {cfg.slo_ttft:g} s and TPOT {cfg.slo_tpot:g} s"
        from ctxlab.sim.plots import rate_plot, sweep_plot, usage_plot

        answer = None
        if sweep_name == "trace-time-scale":
            assert offered is not None
            swept = [
                SweptRate(lbl, offered / r.setup.config.time_scale, r.metrics["slo_attainment"])
                for lbl, r in results
            ]
            answer = highest_rate(swept, slo_attainment)
            plot = rate_plot(
                swept, answer, [r.metrics for _, r in results], out / "rate.png", title
            )
        elif sweep_name:
            rows = [r.metrics for _, r in results]
            plot = sweep_plot(
                sweep_name, [lbl for lbl, _ in results], rows, out / "sweep.png", title
            )
        else:
            plot = usage_plot(results[0][1], out / "usage.png", title)
        if as_json:
            payload: dict = {
                "trace": tr.name,
                "arch": spec.name,
                "device": dev.name,
                "gpus": cfg.gpus,
                "gpus_source": "fewest that hold the weights" if chosen else "given",
                "step_model": results[0][1].step_model,
                "plot": str(plot),
            }
            if sweep_name:
                payload["sweep"] = {
                    "param": sweep_name,
                    "runs": [{"value": lbl, **r.metrics} for lbl, r in results],
                }
                if answer is not None:
                    payload["sweep"]["offered_rate_per_s"] = offered
                    payload["sweep"]["rate_answer"] = _answer_json(answer, slo)
            else:
                payload.update(results[0][1].metrics)
            typer.echo(dumps(payload))
            return
        from rich.console import Console

        console = Console()
        _print_tables(console, title, sweep_name, results, offered)
        if answer is not None:
            console.print(answer.sentence(slo))
        console.print(f"step time: {results[0][1].step_model}")
        console.print(f"plot written to {plot}")


def _calibrate(requests, seed, profile, model, threads, rate, out, as_json) -> None:
    from rich.console import Console

    if requests <= 0:
        raise CtxlabError(f"--requests must be positive, got {requests}")
    if threads <= 0:
        raise CtxlabError(f"--threads must be positive, got {threads}")
    if profile is not None:
        input_file(profile, "--profile", "step-profile JSON file")
    console = Console(stderr=as_json)
    folder = output_dir(out if out != Path("out/simulate") else Path("out/calibrate"))
    from ctxlab.sim.calibration_run import run_calibration

    payload = run_calibration(requests, seed, profile, model, threads, rate, folder, True)
    if as_json:
        typer.echo(dumps(payload))
        return
    _print_calibration(console, payload)


def _print_calibration(console: Console, p: dict[str, Any]) -> None:
    """The engine-vs-simulator table and the diagnostics `run_calibration` returned."""
    from rich.table import Table

    table = Table(
        title=(
            f"calibration: {p['requests']} requests at {p['rate_per_s']:.3f}/s, "
            f"~{p['input_tokens_mean']:.0f} in / ~{p['output_tokens_mean']:.0f} out tokens, "
            f"{p['model']} ({p['torch_threads']} thread)"
        )
    )
    for col in ("latency (s)", "engine", "simulator", "relative error"):
        table.add_column(col, justify="left" if col == "latency (s)" else "right")
    for name in ("ttft", "tpot"):
        for q in (50, 95):
            e, s = p[f"engine_{name}_p{q}"], p[f"sim_{name}_p{q}"]
            table.add_row(f"{name.upper()} p{q}", f"{e:.3f}", f"{s:.3f}", f"{(s - e) / e:+.1%}")
    console.print(table)
    pred = p["replay_step_prediction"]
    console.print(
        f"steps: engine {p['engine_steps']}, simulator {p['sim_steps']}; peak running: engine "
        f"{p['engine_peak_running']}, simulator {p['sim_peak_running']}; engine busy "
        f"{p['engine_busy_fraction']:.0%} of {p['engine_wall_s']:.0f} s"
    )
    console.print(
        f"profile {p['profile']} on the replay's own steps: predicted/measured "
        f"{pred['total_ratio']:.2f} (by third: "
        f"{', '.join(f'{t:.2f}' for t in pred['total_ratio_by_third'])}), median |error| "
        f"{pred['median_abs_rel_error']:.1%}"
    )
    if p.get("profile_after_over_before") is not None:
        console.print(
            "machine speed: the profile's steps took "
            f"{p['profile_after_over_before']:.2f}x as long after the replay as before it"
        )
    met = "MET" if p["goal_met"] else "NOT MET"
    console.print(
        f"goal (|error| of p50 TTFT and p50 TPOT within {p['goal']:.0%}): {met} "
        f"(TTFT {p['ttft_p50_rel_error']:+.1%}, TPOT {p['tpot_p50_rel_error']:+.1%})"
    )
    console.print(f"why: {p['why']}")
    console.print(f"per-request report written to {p['report']}")


def _answer_json(answer: RateAnswer, slo: str) -> dict[str, Any]:
    def run(r: Any) -> dict[str, Any] | None:
        return None if r is None else {"time_scale": r.label, "rate_per_s": r.rate_per_s,
                                       "slo_attainment": r.attainment}  # fmt: skip

    return {
        "target_attainment": answer.target,
        "highest_meeting": run(answer.best),
        "cliff": run(answer.cliff),
        "sentence": answer.sentence(slo),
    }


def _print_tables(
    console, title: str, sweep_name: str | None, results: list, offered: float | None = None
) -> None:
    from rich.table import Table

    from ctxlab.plan.units import fmt_bytes

    table = Table(title=title)
    table.add_column(sweep_name or "figure")
    rated = sweep_name == "trace-time-scale" and offered is not None
    if rated:
        table.add_column("offered r/s", justify="right")
    if sweep_name:
        cols = (
            ("reused_token_fraction", "reused frac", "{:.3f}"),
            ("reused_tokens", "reused tok", "{:,.0f}"),
            ("evictions", "evicted blk", "{:,.0f}"),
            ("preemptions", "preempt", "{:,.0f}"),
            ("peak_running_requests", "peak run", "{:,.0f}"),
            ("ttft_p50", "TTFT p50 s", "{:.3g}"),
            ("ttft_p99", "TTFT p99 s", "{:.3g}"),
            ("tpot_p50", "TPOT p50 s", "{:.3g}"),
            ("goodput_requests_per_s", "goodput r/s", "{:.3g}"),
            ("slo_attainment", "in SLO", "{:.0%}"),
        )
        for _, label, _ in cols:
            table.add_column(label, justify="right")
        for lbl, r in results:
            lead = [f"{offered / r.setup.config.time_scale:.3g}"] if rated else []
            table.add_row(lbl, *lead, *[fmt.format(r.metrics[key]) for key, _, fmt in cols])
        console.print(table)
        return
    m = results[0][1].metrics
    pool = results[0][1].setup.pool_bytes
    table.add_column("value", justify="right")
    table.add_row("KV pool", "unlimited" if pool is None else fmt_bytes(pool))
    for key, label, fmt in _HEADLINE:
        table.add_row(label, fmt.format(m[key]))
    console.print(table)
    _latency_table(console, "latency percentiles", [("run", m)])
