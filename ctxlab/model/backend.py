"""The seam between the model and whoever stores its keys and values.

The decoder computes q, k, v for a flat batch of tokens (tokens of several sequences laid
end to end, nano-vllm style), applies RoPE at each token's position, and hands them to an
`AttentionBackend` per layer. The backend decides where K and V live (a dense tensor for the
oracle tests, the paged pool in the engine) and returns the attention output. Keeping the
seam this narrow is what lets retention policies move and free cache memory without the
model knowing.
"""

from __future__ import annotations

from typing import Protocol

import torch


class AttentionBackend(Protocol):
    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Attention for one layer.

        q: [T, n_heads, head_dim]; k: [T, n_kv_heads, head_dim]; v: [T, n_kv_heads, head_dim_v]
        for the T new tokens of this forward pass (already rotated by RoPE). Returns
        [T, n_heads, head_dim_v]. The backend must store k and v for later steps itself.
        """
        ...


class CompiledDecodeBackend(AttentionBackend, Protocol):
    """A backend that can also hand a layer's whole attention at a pure decode step to
    compiled code: the address of that layer's `decode_block.Attn` for this step (the cache
    write and the decode attention, described), or 0 where this step or layer needs its
    Python path (`attend`). The model's compiled decode block then runs the layer in one call."""

    def compiled_decode(self, layer_idx: int) -> int: ...
