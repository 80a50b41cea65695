"""What the decoder needs to know about a model, read from GGUF metadata or an HF config.json.

One flat, frozen record so the engine and the KV pool can size themselves from it without
touching weights. Both readers normalise their source's quirks here (head_dim not always
hidden/heads, Qwen's `use_sliding_window` switch, old `rope_scaling` vs new `rope_parameters`)
so nothing downstream has to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ctxlab.errors import CtxlabError

# Architectures the readers accept; `ctxlab.model.architectures` says how each one is built
# (the Llama block, possibly with q/k-norm or qkv bias, or Gemma 3's block).
SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
_ARCH_LIST = ", ".join(SUPPORTED_ARCHS)

# What the generic readers below cannot know, per architecture: a hook that completes the
# `ModelConfig` read from GGUF metadata or a config.json dict. Filled by the architecture
# registry (`ctxlab.model.architectures`, imported when the `ctxlab.model` package loads),
# so this module needs no import of the registry, which builds on it.
Completion = Callable[[dict[str, Any], "ModelConfig"], "ModelConfig"]
GGUF_COMPLETIONS: dict[str, Completion] = {}
HF_COMPLETIONS: dict[str, Completion] = {}
_HF_MODEL_TYPES = {"gemma3_text": "gemma3"}  # config.json's name -> the architecture's


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # None for plain RoPE; else a dict with "rope_type" in linear|dynamic|yarn|llama3 plus its
    # parameters, spelled as transformers spells them (factor, original_max_position_embeddings...).
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    # One entry per layer: None (full attention) or the window W (a query sees the last W keys,
    # itself included), as Mistral and Qwen define it.
    sliding_windows: tuple[int | None, ...] = field(default_factory=tuple)
    max_position: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Gemma-style fields (None: the Llama behaviour). RoPE base of the sliding-window layers
    # when it differs from the global layers' `rope_theta`; the softmax scale when it is not
    # head_dim**-0.5 (Gemma's query_pre_attn_scalar**-0.5); a tanh cap on the final logits.
    rope_local_theta: float | None = None
    query_scale: float | None = None
    final_logit_softcap: float | None = None

    def __post_init__(self) -> None:
        if not self.sliding_windows:
            object.__setattr__(self, "sliding_windows", (None,) * self.num_layers)
        if len(self.sliding_windows) != self.num_layers:
            raise CtxlabError(
                f"sliding_windows has {len(self.sliding_windows)} entries "
                f"but the model has {self.num_layers} layers."
            )
        if self.num_heads % self.num_kv_heads:
            raise CtxlabError(
                f"num_heads ({self.num_heads}) is not a multiple of num_kv_heads "
                f"({self.num_kv_heads})."
            )

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    # ------------------------------------------------------------------ readers

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Read a Hugging Face config.json (transformers 4.x or 5.x spelling)."""
        model_type = d.get("model_type", "llama")
        model_type = _HF_MODEL_TYPES.get(model_type, model_type)
        if model_type not in SUPPORTED_ARCHS:
            raise CtxlabError(
                f"model_type {model_type!r} is not supported; ctxlab runs {_ARCH_LIST}."
            )
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            layers = int(d["num_hidden_layers"])
            config = dict(
                vocab_size=int(d["vocab_size"]),
                intermediate_size=int(d["intermediate_size"]),
            )
        except KeyError as exc:
            raise CtxlabError(f"config.json lacks the required field {exc.args[0]!r}.") from None
        kv_heads = int(d.get("num_key_value_heads") or heads)
        head_dim = int(d.get("head_dim") or hidden // heads)
        rope_theta, rope_scaling = _hf_rope(d)
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        cfg = cls(
            arch=model_type,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qk_norm=model_type == "qwen3",
            attention_bias=bool(d.get("attention_bias", model_type == "qwen2")),
            sliding_windows=_hf_sliding_windows(d, model_type, layers),
            max_position=int(d.get("max_position_embeddings", 4096)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            **config,
        )
        return HF_COMPLETIONS[model_type](d, cfg)

    @classmethod
    def from_gguf_fields(
        cls,
        meta: dict[str, Any],
        tensor_names: set[str],
        vocab_size: int,
        origin: str = "the GGUF file",
    ) -> ModelConfig:
        """Read llama.cpp metadata (`{arch}.block_count`, ...) already parsed to Python values;
        `origin` (the file) starts every message."""
        arch = str(meta.get("general.architecture", ""))
        if not arch:
            raise CtxlabError(
                f"{origin}: GGUF key 'general.architecture' is missing, so it names no model "
                "(a header-only or corrupt file?)."
            )
        if arch not in SUPPORTED_ARCHS:
            raise CtxlabError(
                f"{origin}: GGUF architecture {arch!r} is not supported; ctxlab runs {_ARCH_LIST}."
            )

        def get(key: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise CtxlabError(f"{origin}: the GGUF metadata lacks {arch}.{key}.")
            return value

        hidden = int(get("embedding_length"))
        heads = int(get("attention.head_count"))
        kv_heads = int(get("attention.head_count_kv", heads))
        layers = int(get("block_count"))
        head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
        window = meta.get(f"{arch}.attention.sliding_window")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        cfg = cls(
            arch=arch,
            vocab_size=int(meta.get(f"{arch}.vocab_size") or vocab_size),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=_gguf_rope(meta, arch),
            tie_word_embeddings="output.weight" not in tensor_names,
            qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            sliding_windows=(int(window) if window else None,) * layers,
            max_position=int(get("context_length", 4096)),
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (int(eos),),
        )
        return GGUF_COMPLETIONS[arch](meta, cfg)


def _hf_rope(d: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from `rope_parameters` (transformers 5) or `rope_theta`/`rope_scaling`."""
    params = dict(d.get("rope_parameters") or {})
    legacy = dict(d.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", d.get("rope_theta", 10000.0)))
    scaling = {**legacy, **params}
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    if kind == "default":
        return theta, None
    return theta, {"rope_type": kind, **scaling}


def _hf_sliding_windows(d: dict[str, Any], model_type: str, layers: int) -> tuple[int | None, ...]:
    window = d.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not d.get("use_sliding_window", False):
        window = None  # Qwen ships a sliding_window value that is switched off.
    layer_types = d.get("layer_types")
    if layer_types:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    if window is None:
        return (None,) * layers
    if model_type in ("qwen2", "qwen3"):
        first = int(d.get("max_window_layers", layers))
        return tuple(int(window) if i >= first else None for i in range(layers))
    return (int(window),) * layers


def _gguf_rope(meta: dict[str, Any], arch: str) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if not kind or kind == "none" or not factor:
        return None
    out: dict[str, Any] = {"rope_type": str(kind), "factor": float(factor)}
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if original:
        out["original_max_position_embeddings"] = int(original)
    return out
