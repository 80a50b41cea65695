"""`ctxlab simulate`: replay a trace on an architecture and device, print latency and reuse.

Nothing here imports torch; matplotlib is imported only when plots are written.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ctxlab.errors import CtxlabError

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


def _device(name: str, flops: float | None, bandwidth: float | None, memory: str | None):
    from ctxlab.plan.devices import device_from_options

    flags = ("--device-flops", "--device-bandwidth", "--device-memory")
    return device_from_options(name, flops, bandwidth, _bytes(memory, "--device-memory"), flags)


def _bytes(value: str | None, what: str) -> int | None:
    from ctxlab.plan.units import parse_bytes

    return None if value is None else parse_bytes(value, what)


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
        trace: str | None = typer.Argument(
            None, help="A Mooncake .jsonl or a .csv trace, or synthetic:key=value,... (see docs)."
        ),
        arch: str | None = typer.Option(None, "--arch", help="Architecture preset name."),
        config: Path | None = typer.Option(None, "--config", help="Hugging Face config.json."),
        gguf: Path | None = typer.Option(None, "--gguf", help="GGUF file (header only)."),
        device: str = typer.Option("h100", "--device", help="Device preset, or 'custom'."),
        device_flops: float | None = typer.Option(None, help="Peak dense FLOP/s override."),
        device_bandwidth: float | None = typer.Option(None, help="Memory bytes/s override."),
        device_memory: str | None = typer.Option(None, help="Device memory, e.g. 80GiB."),
        gpus: int = typer.Option(1, help="Tensor-parallel devices serving one instance."),
        weights_bytes: str | None = typer.Option(None, help="Weight bytes (default: arch's)."),
        reserve_bytes: str | None = typer.Option(None, help="Runtime reserve (default 10%)."),
        page_size: int = typer.Option(16, help="Tokens per KV page."),
        chunk_tokens: int = typer.Option(2048, help="Token budget per step (chunked prefill)."),
        max_running: int = typer.Option(256, help="Most requests running at once."),
        pool_bytes: str | None = typer.Option(None, help="KV pool size, e.g. 40GiB."),
        unlimited_cache: bool = typer.Option(False, help="A pool that never fills."),
        offload_bytes: str | None = typer.Option(None, help="Host offload tier size."),
        offload_bandwidth: float = typer.Option(25e9, help="Host tier bytes/s."),
        disaggregated: bool = typer.Option(False, help="Separate prefill and decode pools."),
        prefill_gpus: int = typer.Option(1, help="Devices of the prefill instance."),
        kv_transfer_bandwidth: float = typer.Option(50e9, help="Prefill->decode KV bytes/s."),
        slo_ttft: float = typer.Option(2.0, help="TTFT SLO (s) for goodput."),
        slo_tpot: float = typer.Option(0.1, help="TPOT SLO (s) for goodput."),
        compute_efficiency: float = typer.Option(0.5, help="Share of peak FLOP/s reached."),
        memory_efficiency: float = typer.Option(0.8, help="Share of bandwidth reached."),
        step_overhead: float = typer.Option(0.0005, help="Fixed seconds per step."),
        profile: Path | None = typer.Option(None, help="Measured step-time profile JSON."),
        hash_block: int = typer.Option(512, help="Tokens per trace hash id (Mooncake: 512)."),
        sweep: str | None = typer.Option(
            None, help="PARAM=v1,v2,...: pool-bytes, page-size, chunk-tokens or offload-bytes."
        ),
        calibrate: bool = typer.Option(
            False, help="Run a generated trace on the real engine and here; compare latencies."
        ),
        requests: int = typer.Option(24, help="--calibrate: requests in the generated trace."),
        seed: int = typer.Option(0, help="--calibrate: seed of the trace and prompts."),
        rate: float | None = typer.Option(
            None, help="--calibrate: arrivals/s (default: 1.5 x solo capacity, from the profile)."
        ),
        model: str = typer.Option("smollm2-135m", help="--calibrate: the engine's model."),
        threads: int = typer.Option(1, help="--calibrate: torch threads (pinned)."),
        out: Path = typer.Option(Path("out/simulate"), help="Folder for the PNG plots."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Replay a trace: TTFT/TPOT/ITL percentiles, reused tokens, evictions, preemptions."""
        from rich.console import Console

        from ctxlab.arch import resolve_arch
        from ctxlab.sim.config import SimConfig
        from ctxlab.sim.run import simulate as run_sim
        from ctxlab.sim.sweep import parse_sweep, sweep_configs
        from ctxlab.sim.trace import load_trace

        if calibrate:
            _calibrate(requests, seed, profile, model, threads, rate, out, as_json)
            return
        if trace is None:
            raise CtxlabError("give a TRACE (a .jsonl, a .csv or synthetic:...) or --calibrate")
        spec = resolve_arch(arch, config, gguf)
        dev = _device(device, device_flops, device_bandwidth, device_memory)
        cfg = SimConfig(
            page_size=page_size,
            chunk_tokens=chunk_tokens,
            max_running=max_running,
            pool_bytes=_bytes(pool_bytes, "--pool-bytes"),
            unlimited=unlimited_cache,
            weights_bytes=_bytes(weights_bytes, "--weights-bytes"),
            reserve_bytes=_bytes(reserve_bytes, "--reserve-bytes"),
            gpus=gpus,
            offload_bytes=_bytes(offload_bytes, "--offload-bytes") or 0,
            offload_bandwidth=offload_bandwidth,
            disaggregated=disaggregated,
            prefill_gpus=prefill_gpus,
            kv_transfer_bandwidth=kv_transfer_bandwidth,
            slo_ttft=slo_ttft,
            slo_tpot=slo_tpot,
            compute_efficiency=compute_efficiency,
            memory_efficiency=memory_efficiency,
            step_overhead=step_overhead,
            profile=None if profile is None else str(profile),
        )
        runs = [("run", cfg)]
        sweep_name = None
        if sweep:
            sweep_name, values = parse_sweep(sweep)
            runs = list(sweep_configs(cfg, sweep_name, values))
        tr = load_trace(trace, block_tokens=hash_block)  # all lines checked before simulating
        console = Console(stderr=as_json)
        results = []
        from rich.progress import Progress

        with Progress(console=console, transient=True, disable=as_json) as bar:
            task = bar.add_task(f"simulating {len(tr):,} requests", total=len(runs))
            for label, run_cfg in runs:
                results.append((label, run_sim(tr, spec, dev, run_cfg)))
                bar.advance(task)
        title = f"{tr.name}: {spec.name} on {gpus} x {dev.name}"
        out.mkdir(parents=True, exist_ok=True)
        from ctxlab.sim.plots import sweep_plot, usage_plot

        if sweep_name:
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
                "step_model": results[0][1].step_model,
                "plot": str(plot),
            }
            if sweep_name:
                payload["sweep"] = {
                    "param": sweep_name,
                    "runs": [{"value": lbl, **r.metrics} for lbl, r in results],
                }
            else:
                payload.update(results[0][1].metrics)
            typer.echo(json.dumps(payload, default=float))
            return
        _print_tables(console, title, sweep_name, results)
        console.print(f"step time: {results[0][1].step_model}")
        console.print(f"plot written to {plot}")


def _calibrate(requests, seed, profile, model, threads, rate, out, as_json) -> None:
    from rich.console import Console

    from ctxlab.commands._calibrate import check_args, print_calibration, run_calibration

    check_args(requests, threads)
    console = Console(stderr=as_json)
    folder = out if out != Path("out/simulate") else Path("out/calibrate")
    payload = run_calibration(requests, seed, profile, model, threads, rate, folder, console)
    if as_json:
        typer.echo(json.dumps(payload, default=float))
        return
    print_calibration(console, payload)


def _print_tables(console, title: str, sweep_name: str | None, results: list) -> None:
    from rich.table import Table

    from ctxlab.plan.units import fmt_bytes

    table = Table(title=title)
    table.add_column(sweep_name or "figure")
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
        )
        for _, label, _ in cols:
            table.add_column(label, justify="right")
        for lbl, r in results:
            table.add_row(lbl, *[fmt.format(r.metrics[key]) for key, _, fmt in cols])
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
