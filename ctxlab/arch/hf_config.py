"""Read a Hugging Face `config.json` into an `ArchSpec`, getting the known traps right.

Traps handled (each is a real config in the wild):
- `head_dim` is not always hidden/heads (Gemma 3, gpt-oss, Qwen3): the fallback is used only
  when the field is absent or null.
- Qwen2/Qwen3 ship a `sliding_window` value with `use_sliding_window: false`: no sliding.
- Gemma 3 nests the decoder under `text_config` and makes every `sliding_window_pattern`-th
  layer global; Mistral slides in every layer; `layer_types` (when present) is authoritative.
- MLA (`kv_lora_rank`) caches d_c + d_rope per token, not K and V.
- Jamba puts attention on layer i when i % attn_layer_period == attn_layer_offset, Mamba
  elsewhere; Kimi Linear lists its full-attention layers (counted from 1) in
  `linear_attn_config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ctxlab.arch.limits import (
    MAX_COUNT,
    MAX_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_TOKENS,
    MAX_WIDTH,
    check_heads,
)
from ctxlab.arch.params import estimate_params, vision_params
from ctxlab.arch.spec import ArchSpec, LayerSpec, RecurrentState
from ctxlab.errors import CtxlabError
from ctxlab.inputs import load_json

# layer_types values, as transformers spells them, mapped to a mixer.
_LAYER_TYPE_MIXER = {
    "full_attention": "attention",
    "attention": "attention",
    "global_attention": "attention",
    "sliding_attention": "sliding",
    "local_attention": "sliding",
    "linear_attention": "linear",
    "mamba": "mamba",
}
# The most each integer field may hold (MAX_COUNT for any field not named); past it the
# value is absurd and one sentence stops the reader before any per-layer work.
_FIELD_LIMITS = {
    "num_hidden_layers": MAX_LAYERS,
    "num_attention_heads": MAX_HEADS,
    "num_key_value_heads": MAX_HEADS,
    "linear_num_value_heads": MAX_HEADS,
    "num_heads": MAX_HEADS,
    "head_dim": MAX_DIM,
    "kv_lora_rank": MAX_DIM,
    "qk_rope_head_dim": MAX_DIM,
    "qk_nope_head_dim": MAX_DIM,
    "v_head_dim": MAX_DIM,
    "linear_key_head_dim": MAX_DIM,
    "linear_value_head_dim": MAX_DIM,
    "mamba_d_state": MAX_DIM,
    "mamba_d_conv": MAX_DIM,
    "mamba_expand": 64,
    "hidden_size": MAX_WIDTH,
    "sliding_window": MAX_TOKENS,
    "max_position_embeddings": MAX_TOKENS,
    "attn_layer_period": MAX_LAYERS,
    "attn_layer_offset": MAX_LAYERS,
    "sliding_window_pattern": MAX_LAYERS,
    "max_window_layers": MAX_LAYERS,
}
# Sizes the parameter estimate reads: when present they must be whole numbers in range.
_SIZE_FIELDS = (
    "intermediate_size",
    "moe_intermediate_size",
    "num_local_experts",
    "n_routed_experts",
    "num_experts",
    "num_experts_per_tok",
    "experts_per_token",
    "num_experts_per_token",
    "n_shared_experts",
    "num_shared_experts",
    "first_k_dense_replace",
    "moe_layer_freq",
    "expert_layer_offset",
    "q_lora_rank",
    "vocab_size",
)
# Families whose configs leave the sliding pattern implicit (older files lack layer_types).
_DEFAULT_PATTERN = {"gemma3": 6, "gemma3_text": 6, "gemma2": 2}


class _Reader:
    """Field access that names the file and the field in every error."""

    def __init__(self, cfg: Mapping[str, Any], origin: str) -> None:
        self.cfg = cfg
        self.origin = origin

    def fail(self, field: str, why: str) -> CtxlabError:
        return CtxlabError(f"{self.origin}: field {field!r} {why}")

    def has(self, field: str) -> bool:
        return self.cfg.get(field) is not None

    def int(self, field: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.cfg.get(field)
        if value is None:
            if default is None:
                raise self.fail(field, "is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(field, f"must be an integer >= {minimum}, got {value!r}")
        limit = _FIELD_LIMITS.get(field, MAX_COUNT)
        if value > limit:
            raise self.fail(
                field, f"of {value:,} is absurdly large; ctxlab accepts up to {limit:,}"
            )
        return value

    def bool(self, field: str, default: bool) -> bool:
        value = self.cfg.get(field)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(field, f"must be true or false, got {value!r}")
        return value


def _load(path_or_dict: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str, str]:
    """The config dict, an origin for messages, and a default name."""
    if isinstance(path_or_dict, Mapping):
        cfg = dict(path_or_dict)
        return cfg, "config", str(cfg.get("_name_or_path") or cfg.get("model_type") or "config")
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    origin = str(path)
    cfg = load_json(path, "config")
    if not isinstance(cfg, dict):
        raise CtxlabError(f"{origin}: the top level must be a JSON object")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return cfg, origin, name


def _text_config(cfg: dict[str, Any], origin: str) -> dict[str, Any]:
    """Multimodal configs (Gemma 3) nest the decoder; its fields win over the top level."""
    nested = cfg.get("text_config")
    if nested is None:
        return cfg
    if not isinstance(nested, dict):
        raise CtxlabError(f"{origin}: field 'text_config' must be a JSON object")
    merged = {k: v for k, v in cfg.items() if k != "text_config"}
    merged.update(nested)
    return merged


def _mixers(r: _Reader, n_layers: int) -> list[str]:
    """Per layer: attention, sliding, mamba, kda or linear."""
    cfg = r.cfg
    linear_cfg = cfg.get("linear_attn_config")
    if linear_cfg is not None:  # Kimi Linear
        if not isinstance(linear_cfg, Mapping):
            raise r.fail("linear_attn_config", "must be a JSON object")
        full = linear_cfg.get("full_attn_layers")
        if not isinstance(full, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= n_layers for i in full
        ):
            raise r.fail(
                "linear_attn_config.full_attn_layers",
                f"must list layer numbers from 1 to {n_layers}",
            )
        return ["attention" if i + 1 in set(full) else "kda" for i in range(n_layers)]

    if r.has("attn_layer_period"):  # Jamba
        period = r.int("attn_layer_period")
        offset = r.int("attn_layer_offset", default=0, minimum=0)
        if offset >= period:
            raise r.fail("attn_layer_offset", f"must be below attn_layer_period ({period})")
        return ["attention" if i % period == offset else "mamba" for i in range(n_layers)]

    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != n_layers:
            raise r.fail("layer_types", f"must be a list of {n_layers} layer types")
        out = []
        for t in layer_types:
            if t not in _LAYER_TYPE_MIXER:
                raise r.fail(
                    "layer_types",
                    f"has unsupported type {t!r}; supported: {', '.join(_LAYER_TYPE_MIXER)}",
                )
            out.append(_LAYER_TYPE_MIXER[t])
        if "sliding" in out and not r.has("sliding_window"):
            raise r.fail("sliding_window", "is missing but layer_types has sliding layers")
        return out

    if not r.has("sliding_window") or not r.bool("use_sliding_window", default=True):
        return ["attention"] * n_layers
    model_type = str(cfg.get("model_type", ""))
    pattern = cfg.get("sliding_window_pattern", _DEFAULT_PATTERN.get(model_type))
    if pattern is not None:
        pattern = r.int("sliding_window_pattern", default=pattern)
        return ["attention" if (i + 1) % pattern == 0 else "sliding" for i in range(n_layers)]
    if "use_sliding_window" in cfg and r.has("max_window_layers"):
        # Qwen2 with sliding on: layers from max_window_layers upward slide.
        first = r.int("max_window_layers", minimum=0)
        return ["sliding" if i >= first else "attention" for i in range(n_layers)]
    return ["sliding"] * n_layers  # Mistral: every layer


def _attention_layer(r: _Reader, mixer: str, heads: int, kv_heads: int, head_dim: int):
    if r.has("kv_lora_rank"):
        d_c = r.int("kv_lora_rank")
        rope = r.int("qk_rope_head_dim", default=0, minimum=0)
        nope = r.int("qk_nope_head_dim", default=head_dim, minimum=0)
        d_v = r.int("v_head_dim", default=nope)
        if mixer == "sliding":
            raise r.fail("sliding_window", "is not supported together with MLA (kv_lora_rank)")
        return LayerSpec("mla", kv_heads=heads, d_k=nope + rope, d_v=d_v, d_c=d_c, d_rope=rope)
    if mixer == "sliding":
        window = r.int("sliding_window")
        return LayerSpec("sliding", kv_heads=kv_heads, d_k=head_dim, d_v=head_dim, window=window)
    return LayerSpec("full", kv_heads=kv_heads, d_k=head_dim, d_v=head_dim)


def _recurrent_layer(r: _Reader, mixer: str, hidden: int, heads: int, head_dim: int):
    if mixer == "mamba":
        state = RecurrentState(
            "mamba",
            d_model=hidden,
            d_state=r.int("mamba_d_state", default=16),
            d_conv=r.int("mamba_d_conv", default=4),
            expand=r.int("mamba_expand", default=2),
        )
    elif mixer == "kda":
        linear_cfg = r.cfg["linear_attn_config"]
        sub = _Reader(linear_cfg, f"{r.origin}: linear_attn_config")
        state = RecurrentState(
            "kda", heads=sub.int("num_heads", default=heads), head_dim=sub.int("head_dim")
        )
    else:  # linear attention (Qwen3-Next Gated DeltaNet naming)
        state = RecurrentState(
            "linear",
            heads=r.int("linear_num_value_heads", default=heads),
            feature_dim=r.int("linear_key_head_dim", default=head_dim),
            d_v=r.int("linear_value_head_dim", default=head_dim),
        )
    return LayerSpec("recurrent", recurrent=state)


# Encoder-only families: they read the whole input at once and generate nothing, so they
# keep no KV cache; planning one for them would be a number about nothing.
_ENCODER_ONLY = {
    "albert",
    "bert",
    "camembert",
    "deberta",
    "deberta-v2",
    "distilbert",
    "electra",
    "ernie",
    "modernbert",
    "mpnet",
    "nomic_bert",
    "roberta",
    "xlm-roberta",
}
_ENCODER_HEADS = ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification")


def _check_decoder(cfg: Mapping[str, Any], origin: str) -> None:
    """Refuse an encoder-only model (BERT and kin) with the reason, not a made-up KV cache."""
    model_type = str(cfg.get("model_type", "")).lower()
    archs = cfg.get("architectures")
    heads = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    by_head = bool(heads) and all(a.endswith(_ENCODER_HEADS) for a in heads)
    if model_type in _ENCODER_ONLY or (by_head and not cfg.get("is_decoder")):
        what = model_type or heads[0]
        raise CtxlabError(
            f"{origin}: {what!r} is an encoder-only model; it keeps no KV cache, so there is "
            "nothing to plan (ctxlab plans decoders that generate)."
        )


def from_hf_config(
    path_or_dict: str | Path | Mapping[str, Any], name: str | None = None
) -> ArchSpec:
    """Build an `ArchSpec` from a config.json path (or its folder, or the parsed dict)."""
    raw, origin, default_name = _load(path_or_dict)
    _check_decoder(raw, origin)
    cfg = _text_config(raw, origin)
    r = _Reader(cfg, origin)

    n_layers = r.int("num_hidden_layers")
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", default=heads)
    if not r.has("kv_lora_rank"):  # MLA has no KV heads of its own to group
        check_heads(heads, kv_heads, f"{origin}: num_key_value_heads")
    if r.has("head_dim"):
        head_dim = r.int("head_dim")
    else:
        if hidden % heads:
            raise r.fail(
                "head_dim",
                f"is missing and hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {heads}",
            )
        head_dim = hidden // heads

    mixers = _mixers(r, n_layers)
    layers = tuple(
        _attention_layer(r, m, heads, kv_heads, head_dim)
        if m in ("attention", "sliding")
        else _recurrent_layer(r, m, hidden, heads, head_dim)
        for m in mixers
    )

    for field in _SIZE_FIELDS:
        if r.has(field):
            r.int(field, minimum=0)
    if r.has("expert_layer_period"):
        r.int("expert_layer_period")
    estimate_cfg = dict(cfg, head_dim=head_dim, num_key_value_heads=kv_heads)
    kinds = [
        "mla" if r.has("kv_lora_rank") and m in ("attention", "sliding") else m for m in mixers
    ]
    try:
        estimate = estimate_params(estimate_cfg, kinds, hidden)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, AttributeError) as exc:
        raise CtxlabError(f"{origin}: cannot read the MLP/MoE sizes ({exc})") from None

    notes = [
        "parameter count estimated from the config's shapes (biases and small tensors left out)"
    ]
    total, active = estimate.total, estimate.active if estimate.is_moe else None
    vision = raw.get("vision_config")
    if isinstance(vision, dict):
        try:
            tower = vision_params(vision, hidden)
        except (KeyError, TypeError, ValueError, OverflowError, ZeroDivisionError):
            notes.append(
                "the config has a vision tower whose sizes it does not state in full: its "
                "weights are left out of the parameter count"
            )
        else:
            total, active = total + tower, estimate.active
            notes.append(
                f"vision tower counted in the weights ({tower / 1e9:.2f}B parameters estimated "
                "from vision_config, projector included); per-token FLOPs use the text "
                "decoder only"
            )
    if cfg.get("sliding_window") is not None and "sliding" not in mixers:
        notes.append(
            "config has a sliding_window value but no layer slides "
            "(use_sliding_window false or layer_types all global)"
        )
    return ArchSpec(
        name=name or default_name,
        layers=layers,
        n_query_heads=heads,
        hidden_size=hidden,
        params=total,
        active_params=active,
        vocab_size=r.int("vocab_size", default=0, minimum=0),
        max_position=r.int("max_position_embeddings", default=0, minimum=0),
        source=f"config.json: {origin}" if origin != "config" else "config.json (dict)",
        notes=tuple(notes),
    )
