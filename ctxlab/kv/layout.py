"""What one token costs in the pool: lanes, head dims, dtype, block size.

`dtype` is what the pool stores; `compute_dtype` (None: the same) what K/V arrive in and
what reads give back: a bfloat16 cache beside a float32 model (`kv_cache_dtype="bfloat16"`,
as vLLM's `--kv-cache-dtype`) stores half the bytes and widens rows as it reads them.

A lane is one (layer, KV head) pair. Blocks are per lane, so a retention policy can keep a
different set of tokens per KV head and free the rest for real. Bytes are exact integers.
`windows` holds each layer's sliding window (None: a full-attention layer; empty: every
layer is full): a sliding layer's lanes hold only the blocks its window still reads.
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
    windows: tuple[int | None, ...] = ()
    compute_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise CtxlabError(f"block_size must be a positive integer, got {self.block_size}.")
        if min(self.n_layers, self.n_kv_heads, self.head_dim, self.head_dim_v) <= 0:
            raise CtxlabError("a KV layout needs positive layers, KV heads and head dims.")
        if self.windows and len(self.windows) != self.n_layers:
            raise CtxlabError(
                f"a KV layout of {self.n_layers} layers got {len(self.windows)} sliding windows."
            )
        if any(w is not None and w <= 0 for w in self.windows):
            raise CtxlabError("a sliding window must be a positive number of tokens.")
        if all(w is None for w in self.windows):
            object.__setattr__(self, "windows", ())  # no sliding layer: the plain layout

    @property
    def read_dtype(self) -> torch.dtype:
        """The dtype K/V arrive in and reads return (the model's)."""
        return self.compute_dtype or self.dtype

    @property
    def windowed(self) -> bool:
        """Whether some layer is a sliding-window layer."""
        return bool(self.windows)

    def lane_windows(self) -> list[int | None]:
        """Each lane's sliding window (None: full attention), lane by lane."""
        per_layer = self.windows or (None,) * self.n_layers
        return [w for w in per_layer for _ in range(self.n_kv_heads)]

    def window_blocks(self, window: int) -> int:
        """Blocks a sliding lane holds at most, also while the next token is written: the
        W + 1 positions [n - W, n] span at most ceil(W / P) + 1 pages (the window rounded
        up to whole pages, plus one page of slack)."""
        return -(-window // self.block_size) + 1

    def first_kept_block(self, window: int, num_tokens: int) -> int:
        """First block a sliding lane of `num_tokens` tokens keeps: the one holding position
        num_tokens - window, so the lane keeps positions [n - W, n) (the last W tokens, the
        planner's rule, `ctxlab.plan.paging`); the next query reads from n - W + 1 on."""
        return max(0, num_tokens - window) // self.block_size

    def blocks_for_request(self, tokens: int, chunk: int) -> int:
        """Blocks of every lane one request of `tokens` tokens holds at its peak: a full lane
        all of them, a sliding lane its window bound plus the chunk being written."""
        full = -(-tokens // self.block_size)
        total = 0
        for w in self.lane_windows():
            if w is None:
                total += full
            else:
                total += min(full, self.window_blocks(w) + -(-chunk // self.block_size))
        return total

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
