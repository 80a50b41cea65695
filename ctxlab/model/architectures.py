"""The architecture registry: which decoder class runs a GGUF or config.json architecture.

One entry per architecture name. An entry says which model class to build, how llama.cpp
names its per-layer tensors, what the generic config readers cannot know (a hook that
completes the `ModelConfig`), and which weight formats (`--weights`) the class supports,
so an unsupported format is refused before any weight is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ctxlab.errors import CtxlabError
from ctxlab.model import gemma3
from ctxlab.model.config import GGUF_COMPLETIONS, HF_COMPLETIONS, SUPPORTED_ARCHS, ModelConfig
from ctxlab.model.llama import LlamaModel
from ctxlab.model.weights import WEIGHT_FORMATS

# llama.cpp's per-layer tensor names -> transformers' names, for the Llama block.
LLAMA_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _as_read(meta_or_dict: dict[str, Any], cfg: ModelConfig) -> ModelConfig:
    return cfg


@dataclass(frozen=True)
class Architecture:
    """How one architecture name becomes a ctxlab model."""

    name: str
    model: type[LlamaModel]
    gguf_layer_names: Mapping[str, str] = field(default_factory=lambda: LLAMA_GGUF_LAYER_NAMES)
    # Subtracted from every GGUF norm weight to get transformers' value (Gemma: 1).
    gguf_norm_offset: float = 0.0
    # Complete the generic reading of GGUF metadata / a config.json dict.
    gguf_config: Callable[[dict[str, Any], ModelConfig], ModelConfig] = _as_read
    hf_config: Callable[[dict[str, Any], ModelConfig], ModelConfig] = _as_read
    weight_formats: tuple[str, ...] = WEIGHT_FORMATS
    why_not: str = ""  # one clause: why the other weight formats are refused


ARCHITECTURES: dict[str, Architecture] = {
    name: Architecture(name, LlamaModel) for name in ("llama", "mistral", "qwen2", "qwen3")
}
ARCHITECTURES["gemma3"] = Architecture(
    "gemma3",
    gemma3.Gemma3Model,
    gguf_layer_names=gemma3.GGUF_LAYER_NAMES,
    gguf_norm_offset=gemma3.GGUF_NORM_OFFSET,
    gguf_config=gemma3.gguf_config,
    hf_config=gemma3.hf_config,
    weight_formats=("fp32", "fp32-onednn", "bf16", "int4"),
    why_not=(
        "int8 rotates the residual stream, and Gemma's post-attention and post-feedforward "
        "norms scale the sublayer outputs channel by channel before they join it, which no "
        "rotation passes through"
    ),
)
assert set(ARCHITECTURES) == set(SUPPORTED_ARCHS), "config.SUPPORTED_ARCHS and the registry"
for _arch in ARCHITECTURES.values():  # the config readers complete through these hooks
    GGUF_COMPLETIONS[_arch.name] = _arch.gguf_config
    HF_COMPLETIONS[_arch.name] = _arch.hf_config


def architecture(name: str) -> Architecture:
    """The registry entry of an architecture name, or one sentence naming the known ones."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        known = ", ".join(ARCHITECTURES)
        raise CtxlabError(f"architecture {name!r} is not supported; ctxlab runs {known}.") from None


def check_weight_format(arch: Architecture, weights: str, label: str) -> None:
    """Refuse a `--weights` format this architecture cannot run, before weights load."""
    if weights not in arch.weight_formats:
        allowed = ", ".join(arch.weight_formats)
        raise CtxlabError(
            f"--weights {weights} does not work on {label} ({arch.why_not}); use {allowed}."
        )
