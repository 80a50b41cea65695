"""The Llama-family decoder over a flat batch of tokens.

`forward(input_ids[T], positions[T], backend)` runs tokens of several sequences laid end to
end (nano-vllm style): every op but attention is per token, so only the backend needs to
know where one sequence stops. Logits are a separate call because the engine needs them for
one token per sequence, and the vocabulary projection is the largest matmul of a small model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ctxlab.errors import CtxlabError
from ctxlab.model import gemv
from ctxlab.model.backend import AttentionBackend
from ctxlab.model.config import ModelConfig
from ctxlab.model.layers import DecoderLayer, RMSNorm, rope_tables
from ctxlab.model.rope import RotaryEmbedding


class LlamaModel(nn.Module):
    """Embeddings, decoder blocks, final norm and (tied or untied) output projection."""

    layer_class: type[nn.Module] = DecoderLayer  # a subclass's architecture swaps the block

    def __init__(self, cfg: ModelConfig, rope_freq_factors: torch.Tensor | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.layer_class(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else gemv.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        )
        self.rope = RotaryEmbedding(
            cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position, rope_freq_factors
        )
        # Set by `ctxlab.model.weights.convert_weights` when the weights are stored in another
        # format: the output projection as its own module, then used instead of the table.
        self.output: nn.Module | None = None
        self.weight_format = "fp32"

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype (the norms' dtype; packed weight formats keep their own)."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def sliding_windows(self) -> tuple[int | None, ...]:
        """Per layer: None for full attention or the window W the backend must apply."""
        return self.config.sliding_windows

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        """Final hidden states [T, hidden] for T tokens at the given positions."""
        if input_ids.shape != positions.shape or input_ids.dim() != 1:
            raise ValueError("input_ids and positions must both be 1-D of the same length")
        x = self.embed_tokens(input_ids)
        cos, sin = rope_tables(*self.rope.cos_sin(positions, x.dtype))
        for layer in self.layers:
            x = layer.forward(x, cos, sin, backend)  # .forward: no hook dispatch per layer
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [T, vocab] in float32 for hidden states [T, hidden]."""
        if self.output is not None:
            return self.output(hidden).float()
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return gemv.linear(hidden, weight).float()

    # ------------------------------------------------------------------ weights

    def load_hf_state_dict(
        self,
        tensors: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        """Load weights named as in transformers' LlamaForCausalLM, fusing q|k|v and gate|up.

        Every parameter must be covered and every tensor used, so a wrong file fails loudly.
        """
        cfg = self.config
        remaining = dict(tensors)
        take = taker(remaining)

        own: dict[str, torch.Tensor] = {"embed_tokens.weight": take("model.embed_tokens.weight")}
        own["norm.weight"] = take("model.norm.weight")
        if self.lm_head is not None:
            own["lm_head.weight"] = take("lm_head.weight")
        else:
            remaining.pop("lm_head.weight", None)  # tied: some checkpoints store a copy anyway
        for i in range(cfg.num_layers):
            src, dst = f"model.layers.{i}.", f"layers.{i}."
            attn = src + "self_attn."
            own[dst + "self_attn.qkv_proj.weight"] = torch.cat(
                [take(attn + f"{p}_proj.weight") for p in "qkv"]
            )
            if cfg.attention_bias:
                own[dst + "self_attn.qkv_proj.bias"] = torch.cat(
                    [take(attn + f"{p}_proj.bias") for p in "qkv"]
                )
            own[dst + "self_attn.o_proj.weight"] = take(attn + "o_proj.weight")
            if cfg.qk_norm:
                own[dst + "self_attn.q_norm.weight"] = take(attn + "q_norm.weight")
                own[dst + "self_attn.k_norm.weight"] = take(attn + "k_norm.weight")
            own[dst + "mlp.gate_up_proj.weight"] = torch.cat(
                [take(src + "mlp.gate_proj.weight"), take(src + "mlp.up_proj.weight")]
            )
            own[dst + "mlp.down_proj.weight"] = take(src + "mlp.down_proj.weight")
            own[dst + "input_layernorm.weight"] = take(src + "input_layernorm.weight")
            own[dst + "post_attention_layernorm.weight"] = take(
                src + "post_attention_layernorm.weight"
            )
        self.install(own, remaining, dtype, device)

    def install(
        self,
        own: dict[str, torch.Tensor],
        remaining: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        """Load `own` (this class's names) after checking nothing of the checkpoint is left
        unused and every shape is the config's; one sentence otherwise."""
        leftovers = [k for k in remaining if not k.endswith("rotary_emb.inv_freq")]
        if leftovers:
            raise CtxlabError(
                f"the checkpoint has {len(leftovers)} tensors this architecture does not use "
                f"(first: {leftovers[0]})."
            )
        expected = self.state_dict()
        for name, value in own.items():
            if tuple(value.shape) != tuple(expected[name].shape):
                raise CtxlabError(
                    f"tensor {name} has shape {tuple(value.shape)} but the config implies "
                    f"{tuple(expected[name].shape)}."
                )
        # assign=True so a model built on the meta device takes these tensors as they are.
        self.load_state_dict(
            {k: v.to(dtype=dtype, device=device).contiguous() for k, v in own.items()},
            strict=True,
            assign=True,
        )


def taker(remaining: dict[str, torch.Tensor]) -> Callable[[str], torch.Tensor]:
    """`take(name)`: pop a checkpoint tensor from `remaining` (what is left must be unused at
    the end, see `LlamaModel.install`), or one sentence naming the missing tensor."""

    def take(name: str) -> torch.Tensor:
        try:
            return remaining.pop(name)
        except KeyError:
            raise CtxlabError(f"the checkpoint lacks the tensor {name}.") from None

    return take
