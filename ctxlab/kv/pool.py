"""The one storage tensor of the KV cache.

`data[2, num_blocks, block_size, head_dim]`: index 0 holds keys, 1 values, for every
physical block of every lane. Which block belongs to which lane and sequence is the
allocator's and the block table's business; the pool only stores, writes and gathers.
`QuantKVPool` (`ctxlab/kv/quant_pool.py`) stores int8 or KIVI codes behind the same
methods; both implement `KVStore` (`ctxlab/kv/store.py`, `decode_views` included for
the compiled decode attention), and code outside `ctxlab/kv` reads and writes rows only
through it, never through the tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ctxlab.kv import row_write
from ctxlab.kv.layout import KVLayout


class KVPool:
    def __init__(self, layout: KVLayout, num_blocks: int, device: str | torch.device = "cpu"):
        self.layout = layout
        self.num_blocks = num_blocks
        width = max(layout.head_dim, layout.head_dim_v)
        self.data = torch.zeros(
            2, num_blocks, layout.block_size, width, dtype=layout.dtype, device=device
        )
        # Flat views over slots: slot s of block b is row b * block_size + s.
        self._k_rows = self.data[0].view(-1, width)
        self._v_rows = self.data[1].view(-1, width)
        self._writer: tuple[torch.Tensor, row_write.RowWriter | None] | None = None

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def quantized(self) -> bool:
        return False

    @property
    def views(self) -> bool:
        """Whether `run_view` reads in place (False for a cache stored narrower than the
        model computes: its reads are widened copies)."""
        return self.layout.read_dtype == self.data.dtype

    def _widened(self, x: torch.Tensor) -> torch.Tensor:
        want = self.layout.read_dtype
        return x if x.dtype == want else x.to(want)

    @property
    def k(self) -> torch.Tensor:
        return self.data[0]

    @property
    def v(self) -> torch.Tensor:
        return self.data[1]

    @property
    def nbytes(self) -> int:
        """Bytes the pool tensor occupies (its capacity, not what is in use)."""
        return self.num_blocks * self.layout.bytes_per_block

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of one lane (K and V)."""
        return self.layout.bytes_per_block

    def residual_bytes(self, blocks: Sequence[int] | None = None) -> int:
        """Bytes held beside the blocks (a quantized pool's full-precision rows): none."""
        return 0

    def release(self, blocks: Sequence[int]) -> None:
        """Called when blocks lose their last reference; a float pool keeps no state."""

    def write(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v at flat slot rows (`rows` and the leading dims of k/v match)."""
        lay = self.layout
        width = self._k_rows.shape[1]
        bound = self.row_writer()
        if bound is not None and bound.write(rows, k, v):  # compiled, one call
            return
        if lay.head_dim == lay.head_dim_v == width:  # the common case: one fast row copy
            flat = rows.reshape(-1)
            self._k_rows.index_copy_(0, flat, k.reshape(-1, width).to(lay.dtype))
            self._v_rows.index_copy_(0, flat, v.reshape(-1, width).to(lay.dtype))
            return
        self._k_rows[rows, : lay.head_dim] = k.to(lay.dtype)
        self._v_rows[rows, : lay.head_dim_v] = v.to(lay.dtype)

    def row_writer(self) -> row_write.RowWriter | None:
        """The compiled row write bound to this pool's rows (once), or None where it does
        not take them."""
        bound = self._writer
        if bound is None or bound[0] is not self._k_rows:
            bound = self._writer = (self._k_rows, row_write.writer(self._k_rows, self._v_rows))
        return bound[1]

    def gather(self, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of blocks `block_ids[..., nb]` laid out as `[..., nb * block_size, d]`.

        One `index_select` over whole blocks: a row copy, about 8x faster on a CPU than
        advanced indexing with a multi-dimensional index (which goes element by element).
        """
        lay = self.layout
        flat = block_ids.reshape(-1)
        k = torch.index_select(self.data[0], 0, flat)
        v = torch.index_select(self.data[1], 0, flat)
        shape = (*block_ids.shape[:-1], block_ids.shape[-1] * lay.block_size, -1)
        k = k.view(shape)
        v = v.view(shape)
        if lay.head_dim != k.shape[-1]:
            k = k[..., : lay.head_dim]
        if lay.head_dim_v != v.shape[-1]:
            v = v[..., : lay.head_dim_v]
        return self._widened(k), self._widened(v)

    def run_view(
        self, first: int, n_blocks: int, n_heads: int, head_stride: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K `[n_heads, n_blocks * block_size, d_k]` and V (`d_v`) of adjacent blocks, read in
        place (views, no copy): head h holds blocks `first + h * head_stride` onwards.

        Decode attention reads a long lane this way instead of gathering it (a copy of the
        whole lane per layer per token); `head_stride >= 0`.
        """
        lay = self.layout
        width = self._k_rows.shape[1]
        size = (n_heads, n_blocks * lay.block_size)
        stride = (head_stride * lay.block_size * width, width)
        k0 = self.data[0].storage_offset() + first * lay.block_size * width
        v0 = self.data[1].storage_offset() + first * lay.block_size * width
        k = self.data.as_strided((*size, lay.head_dim), (*stride, 1), k0)
        v = self.data.as_strided((*size, lay.head_dim_v), (*stride, 1), v0)
        return self._widened(k), self._widened(v)

    def decode_views(self) -> tuple[str, tuple[np.ndarray, ...]] | None:
        """The storage as numpy views for the compiled decode attention
        (`ctxlab/engine/kernels`): ("f32", (K, V)) or ("bf16", (K bits, V bits)), each
        `[blocks, block_size, width]`, no copy; None for another dtype or device."""
        if self.data.device.type != "cpu":
            return None
        if self.data.dtype == torch.float32:
            return "f32", (self.data[0].numpy(), self.data[1].numpy())
        if self.data.dtype == torch.bfloat16:
            bits = self.data.view(torch.uint16)
            return "bf16", (bits[0].numpy(), bits[1].numpy())
        return None

    def read_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K `[*rows.shape, d_k]` and V `[*rows.shape, d_v]` of flat slot rows (copies)."""
        flat = rows.reshape(-1)
        k = self._k_rows.index_select(0, flat)[:, : self.layout.head_dim]
        v = self._v_rows.index_select(0, flat)[:, : self.layout.head_dim_v]
        return self._widened(k.reshape(*rows.shape, -1)), self._widened(v.reshape(*rows.shape, -1))

    def write_rows(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.write(rows, k, v)

    def copy_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Rows `src` to rows `dst` (all read before any is written)."""
        k, v = self.read_rows(src)
        self.write(dst, k, v)
