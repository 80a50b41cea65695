"""Parameter count estimated from a config's shapes, for configs that do not state one.

The planner needs total parameters (weight bytes) and active parameters (FLOPs per token).
A config.json gives the shapes; this counts the big matrices (embeddings, attention
projections, dense or MoE MLPs, Mamba and KDA projections) and the RMSNorm weights. Biases,
rotary tables and other small tensors are left out, so the result is an estimate within a
fraction of a percent for the common families; callers say so in the spec's notes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Config = Mapping[str, Any]


@dataclass(frozen=True)
class ParamEstimate:
    total: int
    active: int

    @property
    def is_moe(self) -> bool:
        return self.active != self.total


def _get(cfg: Config, *keys: str, default: Any = None) -> Any:
    """The first key that is present and not null; config families name the same thing apart."""
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            return value
    return default


def attention_params(cfg: Config, hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """q, k, v, o projections of a grouped-query attention layer (no biases)."""
    return hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2


def mla_params(cfg: Config, hidden: int, heads: int) -> int:
    """Multi-head latent attention: low-rank query, joint KV down-projection, up-projections."""
    d_c = int(cfg["kv_lora_rank"])
    rope = int(_get(cfg, "qk_rope_head_dim", default=0))
    nope = int(_get(cfg, "qk_nope_head_dim", default=0))
    d_v = int(_get(cfg, "v_head_dim", default=nope))
    q_rank = _get(cfg, "q_lora_rank")
    q_out = heads * (nope + rope)
    q = hidden * q_out if q_rank is None else hidden * int(q_rank) + int(q_rank) * (q_out + 1)
    kv_down = hidden * (d_c + rope) + d_c  # plus its norm
    kv_up = d_c * heads * (nope + d_v)
    out = heads * d_v * hidden
    return q + kv_down + kv_up + out


def mamba_params(cfg: Config, hidden: int) -> int:
    """Mamba-1 mixer as in Jamba: in/out projections, conv, x/dt projections, A and D."""
    d_state = int(_get(cfg, "mamba_d_state", "state_size", default=16))
    d_conv = int(_get(cfg, "mamba_d_conv", "conv_kernel", default=4))
    expand = int(_get(cfg, "mamba_expand", "expand", default=2))
    d_inner = expand * hidden
    dt_rank = _get(cfg, "mamba_dt_rank", "time_step_rank", default="auto")
    dt = -(-hidden // 16) if dt_rank == "auto" else int(dt_rank)
    return (
        hidden * 2 * d_inner  # in_proj
        + d_inner * d_conv  # depthwise conv
        + d_inner * (dt + 2 * d_state)  # x_proj
        + dt * d_inner  # dt_proj
        + d_inner * d_state  # A
        + d_inner  # D
        + d_inner * hidden  # out_proj
    )


def kda_params(hidden: int, heads: int, head_dim: int) -> int:
    """Kimi Delta Attention: q, k, v, output-gate and o projections (low-rank gates left out)."""
    width = heads * head_dim
    return hidden * width * 4 + width * hidden


def linear_attn_params(hidden: int, k_heads: int, v_heads: int, d_k: int, d_v: int) -> int:
    """Gated DeltaNet-style linear attention: q, k, v, gate and o projections."""
    return hidden * (2 * k_heads * d_k + 2 * v_heads * d_v) + v_heads * d_v * hidden


def _is_moe_layer(cfg: Config, i: int, n_experts: int) -> bool:
    if n_experts <= 1:
        return False
    if "expert_layer_period" in cfg:  # Jamba
        period = int(cfg["expert_layer_period"])
        return i % period == int(_get(cfg, "expert_layer_offset", default=0))
    first_dense = int(_get(cfg, "first_k_dense_replace", default=0))
    freq = int(_get(cfg, "moe_layer_freq", default=1) or 1)
    return i >= first_dense and (i - first_dense) % freq == 0


def estimate_params(cfg: Config, mixers: Sequence[str], hidden: int) -> ParamEstimate:
    """Total and active parameters for a decoder whose layer i runs mixer `mixers[i]`.

    `mixers` entries: "attention", "mla", "mamba", "kda", "linear". The caller has already
    validated the fields that decide the layer kinds; this reads the MLP/MoE sizes itself.
    """
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    vocab = int(_get(cfg, "vocab_size", default=0))
    # Gemma configs omit the flag and tie by default; Llama-family configs default to untied.
    family_ties = str(cfg.get("model_type", "")).startswith("gemma")
    tied = bool(_get(cfg, "tie_word_embeddings", default=family_ties))
    inter = int(_get(cfg, "intermediate_size", default=4 * hidden))
    n_experts = int(
        _get(cfg, "num_local_experts", "n_routed_experts", "num_experts", default=0) or 0
    )
    top_k = int(
        _get(cfg, "num_experts_per_tok", "experts_per_token", "num_experts_per_token", default=1)
    )
    moe_inter = int(_get(cfg, "moe_intermediate_size", default=inter))
    n_shared = int(_get(cfg, "n_shared_experts", "num_shared_experts", default=0) or 0)
    linear = cfg.get("linear_attn_config") or {}

    embed = vocab * hidden * (1 if tied else 2) + hidden  # plus the final norm
    # RMSNorm weights: two per layer; Gemma 2/3 add post-norms, Qwen3/Gemma 3 norm q and k.
    model_type = str(cfg.get("model_type", ""))
    norms_per_layer = 2 * hidden
    if model_type.startswith(("gemma2", "gemma3")):
        norms_per_layer += 2 * hidden
    if model_type.startswith(("qwen3", "gemma3")):
        norms_per_layer += 2 * head_dim
    total = active = embed
    for i, mixer in enumerate(mixers):
        if mixer == "mla":
            mix = mla_params(cfg, hidden, heads)
        elif mixer == "mamba":
            mix = mamba_params(cfg, hidden)
        elif mixer == "kda":
            mix = kda_params(
                hidden, int(linear.get("num_heads", heads)), int(linear.get("head_dim", head_dim))
            )
        elif mixer == "linear":
            mix = linear_attn_params(
                hidden,
                int(_get(cfg, "linear_num_key_heads", default=heads)),
                int(_get(cfg, "linear_num_value_heads", default=heads)),
                int(_get(cfg, "linear_key_head_dim", default=head_dim)),
                int(_get(cfg, "linear_value_head_dim", default=head_dim)),
            )
        else:
            mix = attention_params(cfg, hidden, heads, kv_heads, head_dim)
        norms = norms_per_layer
        if _is_moe_layer(cfg, i, n_experts):
            expert = 3 * hidden * moe_inter
            router = hidden * n_experts
            shared = n_shared * expert
            total += mix + norms + router + shared + n_experts * expert
            active += mix + norms + router + shared + min(top_k, n_experts) * expert
        else:
            mlp = 3 * hidden * inter
            total += mix + norms + mlp
            active += mix + norms + mlp
    return ParamEstimate(total=total, active=active)


def vision_params(vision: Config, text_hidden: int) -> int:
    """A ViT vision tower (SigLIP, as in Gemma 3 and LLaVA-style configs) and its projector.

    Patch embedding (3 channels, with bias), learned positions, per layer q/k/v/o with
    biases, two LayerNorms and a biased GELU MLP, the final LayerNorm, and a projector of
    vision width x text width. Raises KeyError/TypeError/ValueError when a size is missing."""
    h = int(vision["hidden_size"])
    inter = int(vision["intermediate_size"])
    layers = int(vision["num_hidden_layers"])
    patch = int(vision["patch_size"])
    image = int(vision["image_size"])
    channels = int(_get(vision, "num_channels", default=3))
    patches = (image // patch) ** 2
    per_layer = 4 * (h * h + h) + 2 * 2 * h + (h * inter + inter) + (inter * h + h)
    embed = channels * patch * patch * h + h + patches * h
    return embed + layers * per_layer + 2 * h + h * text_hidden
