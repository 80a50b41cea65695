"""`ctxlab plan`: what long context costs on paper, before any hardware is bought.

All numbers come from `ctxlab.plan.report.build_plan`; this module only turns options into
its arguments and prints tables, JSON or a plot. Nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ctxlab.commands.options import (
    ConfigOpt,
    CurrencyOpt,
    DeviceBandwidthOpt,
    DeviceFlopsOpt,
    DeviceMemoryOpt,
    DeviceOpt,
    GgufOpt,
    GpusOpt,
    JsonOpt,
    MemBandwidthAlias,
    MemoryBytesAlias,
    PageSizeOpt,
    PeakFlopsAlias,
    PresetArg,
    ReserveBytesOpt,
    WeightsBytesOpt,
    device_from_flags,
    one_source,
    plot_path,
)
from ctxlab.errors import CtxlabError
from ctxlab.json_output import dumps

if TYPE_CHECKING:
    from ctxlab.plan.cost import HostedPrices
    from ctxlab.plan.engines.section import EngineRequest
    from ctxlab.plan.rate_card import RateCard


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
    console.print(
        "custom: --device custom --device-flops F --device-bandwidth B --device-memory 80GiB"
    )


def plan(
    ctx: typer.Context,
    arch: PresetArg = None,
    context: str = typer.Option(
        "4096,32768,131072", "--context", "-c", help="Context lengths, e.g. 4096,128K."
    ),
    concurrency: int = typer.Option(1, "--concurrency", "-n", help="Requests served at once."),
    page_size: PageSizeOpt = 16,
    device: DeviceOpt = "h100",
    gpus: GpusOpt = None,
    config: ConfigOpt = None,
    gguf: GgufOpt = None,
    cache_dtype: str | None = typer.Option(
        None, "--cache-dtype", help="Cache dtype: fp32, bf16, fp16, fp8, int8, int4."
    ),
    shared_prefix: int = typer.Option(
        0, "--shared-prefix", help="Prefix tokens shared by all concurrent requests."
    ),
    output_tokens: int = typer.Option(256, "--output-tokens", help="Tokens generated."),
    weights_bytes: WeightsBytesOpt = None,
    reserve_bytes: ReserveBytesOpt = None,
    device_flops: DeviceFlopsOpt = None,
    device_bandwidth: DeviceBandwidthOpt = None,
    device_memory: DeviceMemoryOpt = None,
    peak_flops: PeakFlopsAlias = None,
    mem_bandwidth: MemBandwidthAlias = None,
    memory_bytes: MemoryBytesAlias = None,
    price_input: float | None = typer.Option(
        None, "--price-input", help="Price of uncached input tokens, per --price-unit tokens."
    ),
    price_output: float | None = typer.Option(
        None, "--price-output", help="Price of output tokens, per --price-unit tokens."
    ),
    price_cache_write: float | None = typer.Option(
        None, "--price-cache-write", help="Price of writing the prefix to the provider cache."
    ),
    price_cache_read: float | None = typer.Option(
        None, "--price-cache-read", help="Price of reading the prefix back from that cache."
    ),
    price_unit: int = typer.Option(1_000_000, "--price-unit", help="Tokens per price."),
    currency: CurrencyOpt = "USD",
    gpu_hourly: float | None = typer.Option(
        None, "--gpu-hourly", help="Self-hosted price of one GPU hour (all --gpus together)."
    ),
    cpu_hourly: float | None = typer.Option(
        None, "--cpu-hourly", help="Self-hosted price of one CPU hour."
    ),
    gpu_seconds: float | None = typer.Option(
        None, "--gpu-seconds", help="Measured GPU seconds (default: roofline estimate)."
    ),
    cpu_seconds: float = typer.Option(0.0, "--cpu-seconds", help="Measured CPU seconds."),
    successes: int = typer.Option(1, "--successes", help="Successful requests in that time."),
    failed: int = typer.Option(
        0, "--failed", help="Requests that failed in that time (their work is still billed)."
    ),
    cancelled: int = typer.Option(
        0, "--cancelled", help="Requests cancelled in that time (their work is still billed)."
    ),
    network_bytes: str | None = typer.Option(
        None,
        "--network-bytes",
        help="KV bytes moved in that time (disaggregation, offload), e.g. 2GB; priced at the "
        "rate card's self_hosted.network_per_gb.",
    ),
    storage_byte_seconds: float = typer.Option(
        0.0,
        "--storage-byte-seconds",
        help="The offload tier's bytes held times seconds held in that time; priced at the "
        "rate card's self_hosted.storage_per_gb_month.",
    ),
    idle_reserve: float = typer.Option(
        0.0,
        "--idle-reserve",
        help="Share of provisioned device time kept idle for bursts, 0 <= r < 1 (billed at "
        "the GPU rate).",
    ),
    rate_card: str | None = typer.Option(
        None,
        "--rate-card",
        help="Hosted prices with length tiers, dated: a TOML file, or 'default' for the "
        "shipped card (docs/cost.md).",
    ),
    as_json: JsonOpt = False,
    plot: Path | None = typer.Option(
        None, "--plot", help="Write a PNG of KV bytes against context, e.g. kv.png."
    ),
    list_: bool = typer.Option(False, "--list", help="List presets and devices."),
    engine: str | None = typer.Option(
        None,
        "--engine",
        help="Predict what a real engine allocates: vllm (exact, from its source), sglang or "
        "llamacpp (from their documentation).",
    ),
    platform: str = typer.Option(
        "gpu", "--platform", help="Engine platform: gpu (block 16) or cpu (vLLM CPU, block 128)."
    ),
    kv_cache_bytes: str | None = typer.Option(
        None,
        "--kv-cache-bytes",
        help="The engine's KV pool per rank, e.g. 1GiB (vLLM: --kv-cache-memory-bytes, "
        "VLLM_CPU_KVCACHE_SPACE in GiB).",
    ),
    gpu_memory_utilization: float | None = typer.Option(
        None,
        "--gpu-memory-utilization",
        help="Share of each device the engine may use (vLLM default 0.92; SGLang "
        "mem_fraction_static).",
    ),
    activation_bytes: str | None = typer.Option(
        None,
        "--activation-bytes",
        help="Per-rank memory the engine's profile run takes besides weights and KV "
        "(activations, CUDA context and graphs), e.g. 4GiB.",
    ),
    max_model_len: str | None = typer.Option(
        None,
        "--max-model-len",
        help="The engine's max_model_len, e.g. 32K (default: the model's trained length).",
    ),
    max_num_batched_tokens: int | None = typer.Option(
        None,
        "--max-num-batched-tokens",
        help="Tokens per scheduler step (default: the engine's for the platform).",
    ),
    slots: int = typer.Option(1, "--slots", help="llama.cpp server slots (-np)."),
    disable_hybrid_kv_cache_manager: bool = typer.Option(
        False,
        "--disable-hybrid-kv-cache-manager",
        help="vLLM with its hybrid manager off: sliding layers keep every token.",
    ),
) -> None:
    """Plan KV memory, paging, sharing, capacity, compute and cost for long context."""
    if list_:
        print_catalogue()
        return
    from ctxlab.plan.cost import SelfHostedRates
    from ctxlab.plan.rate_card import RateCard
    from ctxlab.plan.report import build_plan
    from ctxlab.plan.units import parse_bytes, parse_token_list

    if plot is not None:
        plot_path(plot)
    contexts = parse_token_list(context, "--context")
    if shared_prefix > min(contexts):
        raise CtxlabError(
            f"--shared-prefix {shared_prefix:,} tokens cannot exceed the context length "
            f"({min(contexts):,}); a request cannot share more than it holds"
        )
    dev = device_from_flags(
        device,
        device_flops,
        device_bandwidth,
        device_memory,
        (peak_flops, mem_bandwidth, memory_bytes),
    )
    if arch is None and config is None and gguf is None:
        raise CtxlabError(
            "give an architecture: a preset name, --config config.json or --gguf file "
            "(ctxlab plan --list shows the presets)"
        )
    specs = one_source(arch, config, gguf, many=True)
    flags = (price_input, price_output, price_cache_write, price_cache_read, price_unit)
    prices = _hosted_prices(ctx, rate_card, currency, *flags)
    card = prices if isinstance(prices, RateCard) else None
    if card is not None and gpu_hourly is None:
        gpu_hourly = card.self_hosted.device_hourly
    if card is not None and gpu_hourly is not None and cpu_hourly is None:
        cpu_hourly = card.self_hosted.cpu_hourly
    rates = None
    run = {
        "--failed": failed != 0,
        "--cancelled": cancelled != 0,
        "--network-bytes": network_bytes is not None,
        "--storage-byte-seconds": storage_byte_seconds != 0,
        "--idle-reserve": idle_reserve != 0,
    }
    if gpu_hourly is not None:
        rates = SelfHostedRates(
            gpu_hourly,
            cpu_hourly,
            gpu_seconds,
            cpu_seconds,
            successes,
            failed=failed,
            cancelled=cancelled,
            network_bytes=0
            if network_bytes is None
            else parse_bytes(network_bytes, "--network-bytes"),
            storage_byte_seconds=storage_byte_seconds,
            idle_reserve=idle_reserve,
            network_per_gb=None if card is None else card.self_hosted.network_per_gb,
            storage_per_gb_month=None if card is None else card.self_hosted.storage_per_gb_month,
        )
    elif gpu_seconds is not None or cpu_hourly is not None or any(run.values()):
        extra = [flag for flag, on in run.items() if on]
        raise CtxlabError(
            f"self-hosted cost{' (' + ', '.join(extra) + ')' if extra else ''} needs "
            "--gpu-hourly (or device_hourly in the rate card's [self_hosted] table)"
        )
    engine_request = _engine_request(
        engine,
        platform,
        kv_cache_bytes,
        gpu_memory_utilization,
        activation_bytes,
        max_model_len,
        max_num_batched_tokens,
        _given(ctx, "page_size", page_size),
        slots,
        disable_hybrid_kv_cache_manager,
    )
    weights = None if weights_bytes is None else parse_bytes(weights_bytes, "--weights-bytes")
    reserve = None if reserve_bytes is None else parse_bytes(reserve_bytes, "--reserve-bytes")
    plans = [
        build_plan(
            spec,
            contexts,
            device=dev,
            concurrency=concurrency,
            page_size=page_size,
            shared_prefix=shared_prefix,
            cache_dtype=cache_dtype,
            weights_bytes=weights,
            reserve_bytes=reserve,
            output_tokens=output_tokens,
            prices=prices,
            self_hosted=rates,
            gpus=gpus,
            currency=currency,
            engine=engine_request,
        )
        for spec in specs
    ]
    plot_file = None
    if plot is not None:
        from ctxlab.plan.memory import with_cache_dtype
        from ctxlab.plan.plot import plot_kv_vs_context

        plot_file = plot_kv_vs_context(
            [with_cache_dtype(s, cache_dtype) for s in specs],
            contexts,
            plot,
            cache_dtype=cache_dtype,
        )
    if as_json:
        out: dict[str, Any] = (
            plans[0] if len(plans) == 1 else {"schema": "ctxlab.plan-set/1", "plans": plans}
        )
        typer.echo(dumps(out, indent=2))
        if plot_file is not None:
            typer.echo(f"plot written to {plot_file}", err=True)
        return
    from rich.console import Console

    from ctxlab.plan.tables import print_plan

    console = Console()
    for i, p in enumerate(plans):
        if i:
            console.rule()
        print_plan(p, console)
    if plot_file is not None:
        console.print(f"plot written to {plot_file}")


def _hosted_prices(
    ctx: typer.Context,
    rate_card: str | None,
    currency: str,
    price_input: float | None,
    price_output: float | None,
    price_cache_write: float | None,
    price_cache_read: float | None,
    price_unit: int,
) -> HostedPrices | RateCard | None:
    """A `RateCard` from --rate-card, flat `HostedPrices` from --price-*, or None; giving
    both is a mistake, and so is a --currency that would relabel the card's prices."""
    from ctxlab.plan.cost import HostedPrices
    from ctxlab.plan.rate_card import load_rate_card

    flat = [price_input, price_output, price_cache_write, price_cache_read]
    if rate_card is not None:
        if any(p is not None for p in flat) or _typed(ctx, "price_unit"):
            raise CtxlabError(
                "give hosted prices one way: --rate-card, or --price-input and --price-output"
            )
        card = load_rate_card(rate_card)
        if _typed(ctx, "currency") and currency != card.currency:
            raise CtxlabError(
                f"the rate card prices in {card.currency}; --currency {currency} would "
                "relabel its prices without converting them (leave --currency out)"
            )
        return card
    if price_input is not None or price_output is not None:
        if price_input is None or price_output is None:
            raise CtxlabError("hosted cost needs both --price-input and --price-output")
        return HostedPrices(
            price_input, price_output, price_cache_write, price_cache_read, price_unit
        )
    if price_cache_write is not None or price_cache_read is not None:
        raise CtxlabError("cache prices need --price-input and --price-output as well")
    return None


def _typed(ctx: typer.Context, name: str) -> bool:
    """Whether the user typed the option (not its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _given(ctx: typer.Context, name: str, value: int) -> int | None:
    """The value when the user typed the option, None when it is the default: with --engine,
    --page-size/--block-size is the engine's block size and its absence the engine's own."""
    source = ctx.get_parameter_source(name)  # typer may carry its own copy of click's enum
    return value if source is not None and source.name == "COMMANDLINE" else None


def _engine_request(
    engine: str | None,
    platform: str,
    kv_cache_bytes: str | None,
    memory_utilization: float | None,
    activation_bytes: str | None,
    max_model_len: str | None,
    max_num_batched_tokens: int | None,
    block_size: int | None,
    slots: int,
    disable_hybrid: bool,
) -> EngineRequest | None:
    """`--engine` and its flags as one request; an engine flag without --engine is a mistake."""
    from ctxlab.plan.engines import engine_names
    from ctxlab.plan.engines.pool import PLATFORMS
    from ctxlab.plan.engines.section import EngineRequest
    from ctxlab.plan.units import parse_bytes, parse_tokens

    given = {
        "--kv-cache-bytes": kv_cache_bytes is not None,
        "--gpu-memory-utilization": memory_utilization is not None,
        "--activation-bytes": activation_bytes is not None,
        "--max-model-len": max_model_len is not None,
        "--max-num-batched-tokens": max_num_batched_tokens is not None,
        "--slots": slots != 1,
        "--disable-hybrid-kv-cache-manager": disable_hybrid,
        "--platform": platform != "gpu",
    }
    if engine is None:
        flags = [flag for flag, on in given.items() if on]
        if flags:
            raise CtxlabError(
                f"{', '.join(flags)} describe{'s' if len(flags) == 1 else ''} an engine's "
                f"allocation: add --engine ({', '.join(engine_names())})"
            )
        return None
    name = engine.strip().lower().replace(".", "").replace("-", "")
    if name not in engine_names():
        raise CtxlabError(f"unknown engine {engine!r}; known engines: {', '.join(engine_names())}")
    if platform not in PLATFORMS:
        raise CtxlabError(f"unknown platform {platform!r}; known platforms: {', '.join(PLATFORMS)}")
    only = {
        "--slots": ("llamacpp", slots != 1),
        "--max-num-batched-tokens": ("vllm", max_num_batched_tokens is not None),
        "--disable-hybrid-kv-cache-manager": ("vllm", disable_hybrid),
        "--platform": ("vllm", platform != "gpu"),
    }
    for flag, (owner, on) in only.items():
        if on and name != owner:
            raise CtxlabError(f"{flag} is an option of --engine {owner}, not of --engine {name}")
    return EngineRequest(
        engine=name,
        max_model_len=None
        if max_model_len is None
        else parse_tokens(max_model_len, "--max-model-len"),
        kv_cache_bytes=None
        if kv_cache_bytes is None
        else parse_bytes(kv_cache_bytes, "--kv-cache-bytes"),
        memory_utilization=memory_utilization,
        activation_bytes=0
        if activation_bytes is None
        else parse_bytes(activation_bytes, "--activation-bytes"),
        platform="cpu" if platform == "cpu" else "gpu",
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        slots=slots,
        disable_hybrid=disable_hybrid,
    )


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
