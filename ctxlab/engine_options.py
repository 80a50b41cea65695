"""What every engine command passes to `LLM(...)`, checked before the model loads.

`EngineOptions` holds the engine's settings (model, policy, budget, KV format, page size,
pool, dtype, prefix cache, weight format, RoPE scaling) and `check()` runs every check that needs no
model, so a typo costs a second, not a model load. The CLI (`ctxlab.commands.options`)
builds it from its flags; the workshop builds it from its config. It sits below both, at
the engine's layer, and imports torch only where a check needs it (building a policy, the
model path).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxlab.errors import CtxlabError

DEFAULT_MODEL = "smollm2-135m"
DTYPES = ("float32", "bfloat16")
KV_FORMATS = ("int8", "kivi4", "kivi2")
KV_CACHE_DTYPES = ("auto", "bfloat16")  # what the pool stores (auto: the model's dtype)
# as ctxlab.model.weights (no torch here)
WEIGHT_FORMATS = ("fp32", "fp32-onednn", "bf16", "int8", "int4")


@dataclass
class EngineOptions:
    """What `generate`, `serve` and the other engine commands pass to `LLM(...)`."""

    model: str = DEFAULT_MODEL
    policy: str | None = None
    budget: str | None = None
    kv_format: str | None = None
    kv_cache_dtype: str = "auto"
    page_size: int = 16
    kv_pool_tokens: int = 16384
    dtype: str = "float32"
    prefix_cache: bool = True
    weights: str = "fp32"
    rope_scaling: str | None = None

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
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise CtxlabError(
                f"--kv-cache-dtype {self.kv_cache_dtype!r} is unknown; use one of "
                f"{', '.join(KV_CACHE_DTYPES)}."
            )
        if self.kv_cache_dtype != "auto" and self.kv_format is not None:
            raise CtxlabError(
                f"--kv-format {self.kv_format} stores codes; give it or --kv-cache-dtype "
                f"{self.kv_cache_dtype}, not both."
            )
        from ctxlab.arch.rope_scaling import RopeOverride

        RopeOverride.parse(self.rope_scaling)
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
            "kv_cache_dtype": self.kv_cache_dtype,
            "block_size": self.page_size,
            "kv_pool_tokens": self.kv_pool_tokens,
            "dtype": self.dtype,
            "enable_prefix_caching": self.prefix_cache,
            "weights": self.weights,
            "rope_scaling": self.rope_scaling,
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
