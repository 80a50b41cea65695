"""What one token costs in the pool: lanes, head dims, dtype, block size.

A lane is one (layer, KV head) pair. Blocks are per lane, so a retention policy can keep a
different set of tokens per KV head and free the rest for real. Bytes are exact integers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ctxlab.errors import CtxlabError


@dataclass(frozen=True)
class KVLayout:
    n_layers: int
    n_kv_heads: int
    head_dim: int
    head_dim_v: int
    block_size: int = 16
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise CtxlabError(f"block_size must be a positive integer, got {self.block_size}.")
        if min(self.n_layers, self.n_kv_heads, self.head_dim, self.head_dim_v) <= 0:
            raise CtxlabError("a KV layout needs positive layers, KV heads and head dims.")

    @property
    def n_lanes(self) -> int:
        return self.n_layers * self.n_kv_heads

    @property
    def dtype_bytes(self) -> int:
        return torch.tensor([], dtype=self.dtype).element_size()

    @property
    def bytes_per_block(self) -> int:
        """K and V bytes of one block of one lane."""
        return self.block_size * (self.head_dim + self.head_dim_v) * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes of one token across every lane (the logical per-token cost)."""
        return self.n_lanes * (self.head_dim + self.head_dim_v) * self.dtype_bytes

    def lanes_of_layer(self, layer_idx: int) -> slice:
        return slice(layer_idx * self.n_kv_heads, (layer_idx + 1) * self.n_kv_heads)

    def blocks_for_tokens(self, pool_tokens: int) -> int:
        """Physical blocks (all lanes) of a pool that holds `pool_tokens` tokens per lane."""
        return (pool_tokens // self.block_size) * self.n_lanes

    def tokens_for_bytes(self, pool_bytes: int) -> int:
        """Pool size in tokens (rounded down to whole blocks) that fits in `pool_bytes`."""
        tokens = pool_bytes // self.bytes_per_token
        return (tokens // self.block_size) * self.block_size
