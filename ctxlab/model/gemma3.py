"""Gemma 3 (text): the Llama decoder with Gemma's block, scales and two kinds of layers.

What differs from `LlamaModel` (Gemma Team, "Gemma 3 Technical Report", 2025; checked
against transformers' `Gemma3ForCausalLM` in tests/model/test_gemma3_parity.py):

- Four RMSNorms per block: before and after attention, before and after the MLP; the
  post-norms normalise a sublayer's output before it is added to the residual stream.
- RMSNorm multiplies by (1 + w). llama.cpp's converter stores 1 + w in the GGUF (transformers'
  GGUF loader subtracts the 1 again); ctxlab's `RMSNorm` keeps the multiplier itself, so
  `load_hf_state_dict` (transformers' names and values) adds the 1.
- q/k RMSNorm per head, the embedding multiplied by sqrt(hidden), a GELU-tanh gated MLP.
- The softmax scale is query_pre_attn_scalar**-0.5; the backend applies head_dim**-0.5, so the
  ratio is folded into the q-norm's weight at load (exactly 1 when the two agree, as on 270M).
- Interleaved layers: sliding-window (local, RoPE base 10,000) and global (RoPE base from the
  file). `config.sliding_windows` says which is which; the backend applies the window.
- Tied output head; an optional tanh cap on the final logits (Gemma 2 had one, Gemma 3 has
  none, its GGUF and config say so).

What the GGUF does not store, and where it comes from (`gguf_config`, the one place): the
layer pattern (every 6th layer global, `SLIDING_PATTERN`), the local RoPE base
(`LOCAL_ROPE_THETA`) and query_pre_attn_scalar. llama.cpp hard-codes the same three rules
for `gemma3` (`set_swa_pattern(6)`, `rope_freq_base_train_swa = 10000`, and 1/sqrt(head_dim)
except on the 62-layer 27B, which scales by 1/sqrt(hidden/heads)); transformers'
`Gemma3TextConfig` defaults to the same (`sliding_window_pattern` 6, `rope_local_base_freq`
10,000, `query_pre_attn_scalar` 256). The window itself is read from the file.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ctxlab.errors import CtxlabError
from ctxlab.model.backend import AttentionBackend
from ctxlab.model.config import ModelConfig
from ctxlab.model.layers import MLP, Attention, RMSNorm, rope_tables
from ctxlab.model.llama import LlamaModel, taker
from ctxlab.model.rope import RotaryEmbedding

SLIDING_PATTERN = 6  # layer i is global when (i + 1) % 6 == 0, else sliding
LOCAL_ROPE_THETA = 10_000.0
_27B_LAYERS = 62  # llama.cpp's test for the one size whose query scale is not head_dim

# llama.cpp's per-layer tensor names for gemma3 -> transformers' names (the two post-norms
# are new; `ffn_norm` is the pre-feedforward norm here, the post-attention norm in Llama).
GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GGUF_NORM_OFFSET = 1.0  # llama.cpp stores 1 + w; transformers' value is w


def layer_pattern(num_layers: int, window: int | None) -> tuple[int | None, ...]:
    """Per layer: the window for sliding layers, None for the global ones (every 6th)."""
    if not window:
        return (None,) * num_layers
    return tuple(None if (i + 1) % SLIDING_PATTERN == 0 else int(window) for i in range(num_layers))


def gguf_config(meta: dict[str, Any], cfg: ModelConfig) -> ModelConfig:
    """The generic GGUF reading plus what Gemma 3's file leaves to the architecture's rules."""
    window = meta.get("gemma3.attention.sliding_window")
    if cfg.num_layers == _27B_LAYERS:
        scalar = cfg.hidden_size / cfg.num_heads
    else:
        scalar = float(cfg.head_dim)
    return dataclasses.replace(
        cfg,
        sliding_windows=layer_pattern(cfg.num_layers, window),
        rope_local_theta=LOCAL_ROPE_THETA,
        query_scale=scalar**-0.5,
        qk_norm=True,
    )


def hf_config(d: dict[str, Any], cfg: ModelConfig) -> ModelConfig:
    """The generic config.json reading plus Gemma 3's own fields (`Gemma3TextConfig`)."""
    layers = cfg.num_layers
    window = d.get("sliding_window")
    types = d.get("layer_types")
    if types:
        windows = tuple(int(window) if t == "sliding_attention" else None for t in types)
    else:
        windows = layer_pattern(layers, window)
    params = d.get("rope_parameters") or {}
    full = params.get("full_attention") or {}
    local = params.get("sliding_attention") or {}
    if full.get("rope_type", "default") != "default" or local.get("rope_type", "default") not in (
        "default",
    ):
        raise CtxlabError("Gemma 3 configs with RoPE scaling are not supported by ctxlab yet.")
    theta = float(full.get("rope_theta", d.get("rope_theta", 1_000_000.0)))
    local_theta = float(local.get("rope_theta", d.get("rope_local_base_freq", LOCAL_ROPE_THETA)))
    if d.get("attn_logit_softcapping"):
        raise CtxlabError("attention logit soft-capping (Gemma 2) is not supported by ctxlab.")
    cap = d.get("final_logit_softcapping")
    return dataclasses.replace(
        cfg,
        arch="gemma3",
        sliding_windows=windows,
        rope_theta=theta,
        rope_scaling=None,
        rope_local_theta=local_theta,
        query_scale=float(d.get("query_pre_attn_scalar", 256)) ** -0.5,
        final_logit_softcap=float(cap) if cap else None,
        qk_norm=True,
        attention_bias=False,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
    )


class GeluMLP(MLP):
    """down(gelu_tanh(gate(x)) * up(x)), gate and up in one matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.forward(x).split(self.intermediate, dim=-1)
        return self.down_proj.forward(F.gelu(gate, approximate="tanh").mul_(up))


class Gemma3DecoderLayer(nn.Module):
    """x + post_norm(attn(norm(x))), then x + post_norm(mlp(pre_norm(x)))."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        eps = cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.mlp = GeluMLP(cfg)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        h = self.self_attn.forward(self.input_layernorm.forward(x), cos, sin, backend)
        x = self.post_attention_layernorm.forward(h).add_(x)
        h = self.mlp.forward(self.pre_feedforward_layernorm.forward(x))
        return self.post_feedforward_layernorm.forward(h).add_(x)


class Gemma3Model(LlamaModel):
    """Gemma 3's text decoder on ctxlab's flat-batch interface (see the module docstring)."""

    layer_class = Gemma3DecoderLayer

    def __init__(self, cfg: ModelConfig, rope_freq_factors: torch.Tensor | None = None) -> None:
        if not cfg.tie_word_embeddings:
            raise CtxlabError("a Gemma 3 checkpoint with an untied output head is not supported.")
        super().__init__(cfg, rope_freq_factors)
        # `self.rope` (global layers, the file's base) stays what the engine reads; sliding
        # layers rotate with their own base.
        local_theta = cfg.rope_local_theta or cfg.rope_theta
        self.rope_local = RotaryEmbedding(cfg.head_dim, local_theta, None, cfg.max_position)
        self.embed_scale = float(np.float32(math.sqrt(cfg.hidden_size)))  # fp32, as in HF

    def rope_for_layer(self, layer_idx: int) -> RotaryEmbedding:
        """The rotary embedding layer `layer_idx` was rotated with."""
        return self.rope if self.config.sliding_windows[layer_idx] is None else self.rope_local

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        if input_ids.shape != positions.shape or input_ids.dim() != 1:
            raise ValueError("input_ids and positions must both be 1-D of the same length")
        x = self.embed_tokens(input_ids)
        x = x * self.embed_scale
        tables = {
            False: rope_tables(*self.rope.cos_sin(positions, x.dtype)),
            True: rope_tables(*self.rope_local.cos_sin(positions, x.dtype)),
        }
        for layer, window in zip(self.layers, self.config.sliding_windows, strict=True):
            x = layer.forward(x, *tables[window is not None], backend)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.config.final_logit_softcap
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def load_hf_state_dict(
        self,
        tensors: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        """Load weights named and valued as transformers' Gemma3ForCausalLM (norms as w)."""
        cfg = self.config
        remaining = dict(tensors)
        take = taker(remaining)

        def norm(name: str, scale: float = 1.0) -> torch.Tensor:
            return (1.0 + take(name).float()) * scale

        # The backend scales scores by head_dim**-0.5; the model's own scale is folded into q.
        q_scale = (cfg.query_scale or cfg.head_dim**-0.5) * math.sqrt(cfg.head_dim)
        own: dict[str, torch.Tensor] = {
            "embed_tokens.weight": take("model.embed_tokens.weight"),
            "norm.weight": norm("model.norm.weight"),
        }
        remaining.pop("lm_head.weight", None)  # tied; some checkpoints store a copy
        for i in range(cfg.num_layers):
            src, dst = f"model.layers.{i}.", f"layers.{i}."
            attn = src + "self_attn."
            own[dst + "self_attn.qkv_proj.weight"] = torch.cat(
                [take(attn + f"{p}_proj.weight") for p in "qkv"]
            )
            own[dst + "self_attn.o_proj.weight"] = take(attn + "o_proj.weight")
            own[dst + "self_attn.q_norm.weight"] = norm(attn + "q_norm.weight", q_scale)
            own[dst + "self_attn.k_norm.weight"] = norm(attn + "k_norm.weight")
            own[dst + "mlp.gate_up_proj.weight"] = torch.cat(
                [take(src + "mlp.gate_proj.weight"), take(src + "mlp.up_proj.weight")]
            )
            own[dst + "mlp.down_proj.weight"] = take(src + "mlp.down_proj.weight")
            for name in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ):
                own[dst + name + ".weight"] = norm(src + name + ".weight")
        self.install(own, remaining, dtype, device)
