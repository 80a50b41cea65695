"""`ctxlab plan`: what long context costs on paper, before any hardware is bought.

All numbers come from `ctxlab.plan.report.build_plan`; this module only turns options into
its arguments and prints tables, JSON or a plot. Nothing here imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from ctxlab.errors import CtxlabError


def _device(name: str, peak_flops: float | None, mem_bandwidth: float | None, memory: str | None):
    from ctxlab.plan.devices import device_from_options
    from ctxlab.plan.units import parse_bytes

    memory_bytes = None if memory is None else parse_bytes(memory, "--memory-bytes")
    return device_from_options(name, peak_flops, mem_bandwidth, memory_bytes)


def _archs(arch: str | None, config: Path | None, gguf: Path | None) -> list:
    from ctxlab.arch import resolve_arch

    specs = []
    if arch:
        specs += [resolve_arch(name=name.strip()) for name in arch.split(",") if name.strip()]
    if config is not None:
        specs.append(resolve_arch(config=config))
    if gguf is not None:
        specs.append(resolve_arch(gguf=gguf))
    if not specs:
        raise CtxlabError(
            "give an architecture: a preset name, --config config.json or --gguf file "
            "(ctxlab plan --list shows the presets)"
        )
    return specs


def print_catalogue() -> None:
    """`--list`: the presets with their sources, then the devices."""
    from rich.console import Console
    from rich.table import Table

    from ctxlab.arch import list_presets
    from ctxlab.plan.devices import DEVICES
    from ctxlab.plan.units import fmt_bytes

    console = Console()
    table = Table(title="Architecture presets", title_justify="left")
    for col in ("name", "description", "source"):
        table.add_column(col, overflow="fold")
    for name, source, description in list_presets():
        table.add_row(name, description, source)
    console.print(table)
    table = Table(title="Devices", title_justify="left")
    for col in ("name", "peak 16-bit FLOP/s", "bandwidth", "memory", "source"):
        table.add_column(col)
    for device in DEVICES.values():
        table.add_row(
            device.name,
            f"{device.peak_flops / 1e12:,.0f} T",
            f"{device.mem_bandwidth / 1e12:,.2f} TB/s",
            fmt_bytes(device.memory_bytes),
            device.source,
        )
    console.print(table)
    console.print("custom: --device custom --peak-flops F --mem-bandwidth B --memory-bytes 80GiB")


def plan(
    arch: str | None = typer.Argument(
        None, help="Preset name, or several separated by commas (see --list)."
    ),
    context: str = typer.Option(
        "4096,32768,131072", "--context", "-c", help="Context lengths, e.g. 4096,128K."
    ),
    concurrency: int = typer.Option(1, "--concurrency", "-n", help="Requests served at once."),
    page_size: int = typer.Option(16, "--page-size", help="Tokens per KV page."),
    device: str = typer.Option("h100", "--device", help="h100, h200, a100-80gb or custom."),
    gpus: int = typer.Option(1, "--gpus", help="Devices in tensor parallel."),
    config: Path | None = typer.Option(None, "--config", help="A Hugging Face config.json."),
    gguf: Path | None = typer.Option(None, "--gguf", help="A GGUF file (header only is read)."),
    cache_dtype: str | None = typer.Option(
        None, "--cache-dtype", help="Cache dtype: fp32, bf16, fp16, fp8, int8, int4."
    ),
    shared_prefix: int = typer.Option(
        0, "--shared-prefix", help="Prefix tokens shared by all concurrent requests."
    ),
    output_tokens: int = typer.Option(256, "--output-tokens", help="Tokens generated."),
    weights_bytes: str | None = typer.Option(
        None, "--weights-bytes", help="Weights in memory, e.g. 48GiB (default: params x 2 B)."
    ),
    reserve_bytes: str | None = typer.Option(
        None, "--reserve-bytes", help="Runtime reserve, e.g. 8GiB (default: 10% of memory)."
    ),
    peak_flops: float | None = typer.Option(None, "--peak-flops", help="FLOP/s, e.g. 989e12."),
    mem_bandwidth: float | None = typer.Option(
        None, "--mem-bandwidth", help="Bytes/s, e.g. 3.35e12."
    ),
    memory_bytes: str | None = typer.Option(None, "--memory-bytes", help="e.g. 80GiB."),
    price_input: float | None = typer.Option(None, "--price-input", help="Uncached input."),
    price_output: float | None = typer.Option(None, "--price-output", help="Output tokens."),
    price_cache_write: float | None = typer.Option(None, "--price-cache-write"),
    price_cache_read: float | None = typer.Option(None, "--price-cache-read"),
    price_unit: int = typer.Option(1_000_000, "--price-unit", help="Tokens per price."),
    gpu_hourly: float | None = typer.Option(None, "--gpu-hourly", help="Self-hosted GPU rate."),
    cpu_hourly: float | None = typer.Option(None, "--cpu-hourly", help="Self-hosted CPU rate."),
    gpu_seconds: float | None = typer.Option(
        None, "--gpu-seconds", help="Measured GPU seconds (default: roofline estimate)."
    ),
    cpu_seconds: float = typer.Option(0.0, "--cpu-seconds", help="Measured CPU seconds."),
    successes: int = typer.Option(1, "--successes", help="Successful requests in that time."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    plot: Path | None = typer.Option(None, "--plot", help="Write KV bytes vs context PNG."),
    list_: bool = typer.Option(False, "--list", help="List presets and devices."),
) -> None:
    """Plan KV memory, paging, sharing, capacity, compute and cost for long context."""
    if list_:
        print_catalogue()
        return
    from ctxlab.plan.cost import HostedPrices, SelfHostedRates
    from ctxlab.plan.report import build_plan
    from ctxlab.plan.units import parse_bytes, parse_token_list

    contexts = parse_token_list(context, "--context")
    dev = _device(device, peak_flops, mem_bandwidth, memory_bytes)
    specs = _archs(arch, config, gguf)
    prices = None
    if price_input is not None or price_output is not None:
        if price_input is None or price_output is None:
            raise CtxlabError("hosted cost needs both --price-input and --price-output")
        prices = HostedPrices(
            price_input, price_output, price_cache_write, price_cache_read, price_unit
        )
    elif price_cache_write is not None or price_cache_read is not None:
        raise CtxlabError("cache prices need --price-input and --price-output as well")
    rates = None
    if gpu_hourly is not None:
        rates = SelfHostedRates(gpu_hourly, cpu_hourly, gpu_seconds, cpu_seconds, successes)
    elif gpu_seconds is not None or cpu_hourly is not None:
        raise CtxlabError("self-hosted cost needs --gpu-hourly")

    plans = [
        build_plan(
            spec,
            contexts,
            device=dev,
            concurrency=concurrency,
            page_size=page_size,
            shared_prefix=shared_prefix,
            cache_dtype=cache_dtype,
            weights_bytes=None if weights_bytes is None else parse_bytes(weights_bytes),
            reserve_bytes=None if reserve_bytes is None else parse_bytes(reserve_bytes),
            output_tokens=output_tokens,
            prices=prices,
            self_hosted=rates,
            gpus=gpus,
        )
        for spec in specs
    ]
    plot_path = None
    if plot is not None:
        from ctxlab.plan.memory import with_cache_dtype
        from ctxlab.plan.plot import plot_kv_vs_context

        plot_path = plot_kv_vs_context(
            [with_cache_dtype(s, cache_dtype) for s in specs], contexts, plot
        )
    if as_json:
        out: dict[str, Any] = (
            plans[0] if len(plans) == 1 else {"schema": "ctxlab.plan-set/1", "plans": plans}
        )
        typer.echo(json.dumps(out, indent=2))
        if plot_path is not None:
            typer.echo(f"plot written to {plot_path}", err=True)
        return
    from rich.console import Console

    from ctxlab.plan.tables import print_plan

    console = Console()
    for i, p in enumerate(plans):
        if i:
            console.rule()
        print_plan(p, console)
    if plot_path is not None:
        console.print(f"plot written to {plot_path}")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
