"""What a KV pool is to everything above `ctxlab/kv`: the `KVStore` protocol.

Two pools implement it: `KVPool` (K/V in the layout dtype, `kv/pool.py`) and
`QuantKVPool` (int8 or KIVI codes and scales, `kv/quant_pool.py`). Attention, compaction,
the policy runtime and the manager read and write rows only through these methods, so they
hold a `KVStore` and never ask which pool it is.

Rows are flat slot indices: slot s of block b is row `b * block_size + s`. Reads return
the layout dtype (a quantized pool dequantizes). `views` says whether `run_view` returns
views into the storage (no copy) or decoded copies: readers that read long lanes in place
(`engine/lane_runs.py`) gain only from views.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from ctxlab.kv.layout import KVLayout

Pair = tuple[torch.Tensor, torch.Tensor]  # keys and values


class KVStore(Protocol):
    layout: KVLayout
    num_blocks: int

    @property
    def device(self) -> torch.device: ...

    # -- layout of the storage -------------------------------------------------------------
    @property
    def quantized(self) -> bool:
        """K/V are stored as codes (reads dequantize); memory figures name the format."""
        ...

    @property
    def views(self) -> bool:
        """`run_view` returns views into the storage (float pools), not decoded copies."""
        ...

    # -- bytes ----------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Capacity in bytes: every block, plus any side store."""
        ...

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of one lane (K and V)."""
        ...

    def residual_bytes(self, blocks: Sequence[int] | None = None) -> int:
        """Bytes held beside the blocks (of `blocks`, or of all): a quantized pool's
        full-precision rows of partially filled blocks; 0 for a float pool."""
        ...

    def release(self, blocks: Sequence[int]) -> None:
        """Blocks lost their last reference: drop any state held for them."""
        ...

    # -- writes and reads -----------------------------------------------------------------
    def write(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v at flat slot rows (`rows` and the leading dims of k/v match)."""
        ...

    def write_rows(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...

    def copy_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Rows `src` to rows `dst` (all read before any is written)."""
        ...

    def gather(self, block_ids: torch.Tensor) -> Pair:
        """K and V of blocks `block_ids[..., nb]` laid out as `[..., nb * block_size, d]`."""
        ...

    def read_rows(self, rows: torch.Tensor) -> Pair:
        """K `[*rows.shape, d_k]` and V `[*rows.shape, d_v]` of flat slot rows."""
        ...

    def run_view(self, first: int, n_blocks: int, n_heads: int, head_stride: int) -> Pair:
        """K `[n_heads, n_blocks * block_size, d_k]` and V of adjacent blocks: head h holds
        blocks `first + h * head_stride` onwards (views when `views`, else copies)."""
        ...

    def decode_views(self) -> tuple[str, tuple[np.ndarray, ...]] | None:
        """The storage as numpy views for the compiled decode attention (`engine/kernels`):
        a format name and its arrays, no copy; None where the kernel cannot read this pool
        in place (another dtype, a KIVI pool, not the CPU)."""
        ...
