"""A quantized KV pool: `KVPool`'s methods over int8 or KIVI 4/2-bit codes and scales.

The pool tensors hold codes and float32 scales, not floats, so the pool itself is smaller
(`block_bytes` is measured from the tensors and equals `kv_bytes(block_size)` exactly):
- `int8`: per token and lane, symmetric absmax (codes `int8 [blocks, bs, d]`, one scale
  per row). A row is quantized when it is written.
- `kivi4` / `kivi2` (KIVI, Liu et al., ICML 2024): keys per channel over a group of `G`
  tokens, values per token over groups of `VG` channels, asymmetric (scale and zero point),
  codes bit-packed along the channel dim. `G = gcd(group, block_size)` so a key group never
  spans two blocks (32 with 32- or 64-token blocks, 16 with the engine's default 16), and
  `VG = gcd(group, head_dim_v)`. The rows of a group that is not yet full stay in full
  precision in a small residual store (one block-sized buffer per partially filled block,
  keyed by block id); when the group fills it is quantized, and when the block fills its
  buffer is released. So a lane holds at most one full-precision block, its last.

Block life cycle. Writes append: a block's slots are written from slot 0 on, and writing
slot 0 means a new owner, so its state (fill count, groups done) starts over. A block freed
while partially filled gives its residual buffer back at once (`release`, called by the
allocator when a block's last reference goes). Full blocks are never re-quantized: a prefix
shared block is only read, and a compaction reads the kept rows (dequantized, `read_rows`)
and writes them into fresh blocks, where they are quantized in their new groups.

Reads (`gather`, `read_rows`) dequantize into the layout dtype; the rows of a block's
unfinished group come from the residual store, as written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ctxlab.errors import CtxlabError
from ctxlab.kv.layout import KVLayout
from ctxlab.kv.quantize import BITS, FORMATS, pack_bits, quantize_asym, quantize_int8, unpack_bits
from ctxlab.kv.store import KVStore, Pair

I64 = torch.int64


class QuantKVPool:
    def __init__(
        self,
        layout: KVLayout,
        num_blocks: int,
        fmt: str = "kivi4",
        group: int = 32,
        device: str | torch.device = "cpu",
    ):
        if fmt not in FORMATS:
            raise CtxlabError(f"KV format {fmt!r} is unknown; use one of {', '.join(FORMATS)}.")
        if group < 1:
            raise CtxlabError(f"the quantization group must be at least 1, got {group}.")
        self.layout, self.num_blocks, self.fmt = layout, num_blocks, fmt
        self.bits = BITS[fmt]
        bs, dk, dv = layout.block_size, layout.head_dim, layout.head_dim_v
        self.bs, self.dk, self.dv = bs, dk, dv
        f32 = dict(dtype=torch.float32, device=device)
        if fmt == "int8":
            self.G, self.VG = 1, dv
            self.kq = torch.zeros(num_blocks, bs, dk, dtype=torch.int8, device=device)
            self.vq = torch.zeros(num_blocks, bs, dv, dtype=torch.int8, device=device)
            self.ks = torch.zeros(num_blocks, bs, 1, **f32)
            self.vs = torch.zeros(num_blocks, bs, 1, **f32)
            self.kz = self.vz = None
        else:
            per = 8 // self.bits
            if dk % per or dv % per:
                raise CtxlabError(
                    f"{fmt} packs {per} codes per byte; head dims {dk} and {dv} must be multiples."
                )
            self.G, self.VG = math.gcd(group, bs), math.gcd(group, dv)
            u8 = dict(dtype=torch.uint8, device=device)
            self.kq = torch.zeros(num_blocks, bs, dk // per, **u8)
            self.vq = torch.zeros(num_blocks, bs, dv // per, **u8)
            self.ks = torch.zeros(num_blocks, bs // self.G, dk, **f32)
            self.kz = torch.zeros(num_blocks, bs // self.G, dk, **f32)
            self.vs = torch.zeros(num_blocks, bs, dv // self.VG, **f32)
            self.vz = torch.zeros(num_blocks, bs, dv // self.VG, **f32)
        # Residual store (KIVI only): full-precision rows of partially filled blocks.
        # Bookkeeping lives with the codes; block ids and rows coming in are moved there.
        self.res_of = torch.full((num_blocks,), -1, dtype=I64, device=device)  # residual slot
        self.fill = torch.zeros(num_blocks, dtype=I64, device=device)  # slots since slot 0
        self.rk = torch.zeros(0, bs, dk, dtype=layout.dtype, device=device)
        self.rv = torch.zeros(0, bs, dv, dtype=layout.dtype, device=device)
        self._res_free: list[int] = []
        self._slot_idx = torch.arange(bs, device=device)

    # -- sizes ----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.kq.device

    @property
    def quantized(self) -> bool:
        return True

    @property
    def views(self) -> bool:
        return False  # codes have no float view: a run is decoded (`run_view`)

    def _tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.kq, self.ks, self.kz, self.vq, self.vs, self.vz) if t is not None]

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of one lane: codes, scales and zero points (measured)."""
        return sum(t[0].numel() * t.element_size() for t in self._tensors())

    @property
    def residual_block_bytes(self) -> int:
        """Bytes of one full-precision residual buffer (a block's K and V rows)."""
        return self.bs * (self.dk + self.dv) * self.layout.dtype_bytes

    @property
    def residual_blocks(self) -> int:
        return int(self.rk.shape[0]) - len(self._res_free)

    def residual_bytes(self, blocks: Sequence[int] | None = None) -> int:
        """Residual bytes held for `blocks` (a list of block ids), or for every block."""
        if blocks is None:
            return self.residual_blocks * self.residual_block_bytes
        if len(blocks) == 0:
            return 0
        idx = torch.as_tensor(blocks, dtype=I64).to(self.device)
        return int((self.res_of.index_select(0, idx) >= 0).sum()) * self.residual_block_bytes

    @property
    def nbytes(self) -> int:
        """Capacity: every block's codes and scales plus the residual store's buffers."""
        return (
            self.num_blocks * self.block_bytes + int(self.rk.shape[0]) * self.residual_block_bytes
        )

    # -- residual store -------------------------------------------------------------------
    def _assign(self, blocks: torch.Tensor) -> None:
        need = int(blocks.numel())
        cap = int(self.rk.shape[0])
        if len(self._res_free) < need:
            new_cap = max(2 * cap, cap + need - len(self._res_free), 16)
            for name in ("rk", "rv"):
                old = getattr(self, name)
                grown = old.new_zeros(new_cap, *old.shape[1:])
                grown[:cap] = old
                setattr(self, name, grown)
            self._res_free.extend(range(new_cap - 1, cap - 1, -1))
        slots = [self._res_free.pop() for _ in range(need)]
        self.res_of[blocks] = torch.tensor(slots, dtype=I64, device=self.device)

    def release(self, blocks: Sequence[int]) -> None:
        """Give back the residual buffers of `blocks` (freed, or just filled)."""
        if self.fmt == "int8" or len(blocks) == 0:
            return
        idx = torch.as_tensor(blocks, dtype=I64).to(self.device)
        r = self.res_of.index_select(0, idx)
        held = r >= 0
        if bool(held.any()):
            self._res_free.extend(r[held].tolist())
            self.res_of[idx[held]] = -1

    def _shrink(self) -> None:
        """Drop the residual store's buffers when none is in use."""
        if self.residual_blocks == 0:
            self.rk, self.rv = self.rk[:0].clone(), self.rv[:0].clone()
            self._res_free = []

    # -- writes ---------------------------------------------------------------------------
    def write(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v at flat slot rows (`rows` and the leading dims of k/v match)."""
        flat = rows.reshape(-1).to(self.device)
        k = k.reshape(-1, self.dk)
        v = v.reshape(-1, self.dv)
        if self.fmt == "int8":
            for q, s, x in ((self.kq, self.ks, k), (self.vq, self.vs, v)):
                codes, scale = quantize_int8(x)
                q.view(-1, q.shape[-1]).index_copy_(0, flat, codes)
                s.view(-1, 1).index_copy_(0, flat, scale)
            return
        bs = self.bs
        blk, slot = flat // bs, flat % bs
        first = blk[slot == 0]
        if first.numel():  # a new owner starts the block over
            self.fill.index_fill_(0, first, 0)
        touched = torch.unique(blk)
        missing = touched[self.res_of.index_select(0, touched) < 0]
        if missing.numel():
            self._assign(missing)
        at = self.res_of.index_select(0, blk) * bs + slot
        self.rk.view(-1, self.dk).index_copy_(0, at, k.to(self.rk.dtype))
        self.rv.view(-1, self.dv).index_copy_(0, at, v.to(self.rv.dtype))
        groups_before = self.fill.index_select(0, touched) // self.G
        self.fill.scatter_reduce_(0, blk, slot + 1, "amax")
        filled = self.fill.index_select(0, touched)
        n_new = filled // self.G - groups_before
        if bool((n_new > 0).any()):
            self._quantize_groups(touched, groups_before, n_new)
        done = touched[filled == bs]
        if done.numel():
            self.release(done)

    def _quantize_groups(self, blocks: torch.Tensor, first: torch.Tensor, count: torch.Tensor):
        """Quantize groups `first[i] .. first[i] + count[i] - 1` of `blocks[i]`."""
        G, ng, bits = self.G, self.bs // self.G, self.bits
        has = count > 0
        blocks, first, count = blocks[has], first[has], count[has]
        b = blocks.repeat_interleave(count)
        start = (torch.cumsum(count, 0) - count).repeat_interleave(count)
        g = first.repeat_interleave(count) - start
        g += torch.arange(int(count.sum()), device=g.device)
        r = self.res_of.index_select(0, b)
        m = int(b.numel())
        rk = self.rk.view(-1, ng, G, self.dk)[r, g]  # [m, G, dk]
        rv = self.rv.view(-1, ng, G, self.dv)[r, g]
        qk, sk, zk = quantize_asym(rk, bits, dim=1)  # keys: per channel over G tokens
        nvg = self.dv // self.VG
        qv, sv, zv = quantize_asym(rv.reshape(m, G, nvg, self.VG), bits, dim=3)  # values
        self.kq.view(-1, ng, G, self.kq.shape[-1])[b, g] = pack_bits(qk, bits)
        self.ks[b, g] = sk[:, 0]
        self.kz[b, g] = zk[:, 0]  # type: ignore[index]
        self.vq.view(-1, ng, G, self.vq.shape[-1])[b, g] = pack_bits(qv.reshape(m, G, -1), bits)
        self.vs.view(-1, ng, G, nvg)[b, g] = sv[..., 0]
        self.vz.view(-1, ng, G, nvg)[b, g] = zv[..., 0]  # type: ignore[union-attr]

    def write_rows(self, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.write(rows, k, v)

    def copy_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Rows `src` to rows `dst` (all read before any is written)."""
        k, v = self.read_rows(src)
        self.write(dst, k, v)

    # -- reads ----------------------------------------------------------------------------
    def gather(self, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized K and V of blocks `block_ids[..., nb]` as `[..., nb * block_size, d]`."""
        flat = block_ids.reshape(-1).to(self.device)
        n, bs = int(flat.numel()), self.bs
        if self.fmt == "int8":
            k = self.kq.index_select(0, flat).float().mul_(self.ks.index_select(0, flat))
            v = self.vq.index_select(0, flat).float().mul_(self.vs.index_select(0, flat))
        else:
            assert self.kz is not None and self.vz is not None
            ng, nvg, G = bs // self.G, self.dv // self.VG, self.G
            # codes * scale + zero, as dequantize_asym, in place on the float copy (faster)
            k = unpack_bits(self.kq.index_select(0, flat), self.bits).float()
            k = k.view(n, ng, G, self.dk).mul_(self.ks.index_select(0, flat)[:, :, None])
            k.add_(self.kz.index_select(0, flat)[:, :, None])
            v = unpack_bits(self.vq.index_select(0, flat), self.bits).float()
            v = v.view(n, bs, nvg, self.VG).mul_(self.vs.index_select(0, flat)[..., None])
            v.add_(self.vz.index_select(0, flat)[..., None])
            k, v = k.view(n, bs, self.dk), v.view(n, bs, self.dv)
            self._overlay(flat, k, v)
        shape = (*block_ids.shape[:-1], block_ids.shape[-1] * bs)
        return self._out(k).view(*shape, self.dk), self._out(v).view(*shape, self.dv)

    def run_view(self, first: int, n_blocks: int, n_heads: int, head_stride: int) -> Pair:
        """`KVPool.run_view`'s keys and values, decoded (a copy: codes have no float view)."""
        heads = torch.arange(n_heads, device=self.device)[:, None] * head_stride
        return self.gather(first + heads + torch.arange(n_blocks, device=self.device))

    def decode_views(self) -> tuple[str, tuple[np.ndarray, ...]] | None:
        """The int8 codes and row scales as numpy views for the compiled decode attention
        (`ctxlab/engine/kernels`): ("int8", (K codes, K scales, V codes, V scales)), codes
        `[blocks, bs, d]`, scales `[blocks, bs]`, no copy. None for KIVI (its residual rows
        live beside the codes) or off the CPU."""
        if self.fmt != "int8" or self.device.type != "cpu":
            return None
        nb, bs = self.ks.shape[:2]
        return "int8", (
            self.kq.numpy(),
            self.ks.view(nb, bs).numpy(),
            self.vq.numpy(),
            self.vs.view(nb, bs).numpy(),
        )

    def _out(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.dtype == self.layout.dtype else x.to(self.layout.dtype)

    def _overlay(self, flat: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Rows of unfinished groups of the gathered blocks come from the residual store."""
        r = self.res_of.index_select(0, flat)
        sel = torch.nonzero(r >= 0).flatten()
        if not sel.numel():
            return
        rr = r.index_select(0, sel)
        done = self.fill.index_select(0, flat.index_select(0, sel)) // self.G * self.G
        fresh = (self._slot_idx[None, :] >= done[:, None])[..., None]  # [m, bs, 1]
        k[sel] = torch.where(fresh, self.rk.index_select(0, rr).float(), k[sel])
        v[sel] = torch.where(fresh, self.rv.index_select(0, rr).float(), v[sel])

    def read_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized K `[*rows.shape, d_k]` and V of flat slot rows (what gather gives)."""
        flat = rows.reshape(-1).to(self.device)
        bs = self.bs
        kq = self.kq.view(-1, self.kq.shape[-1]).index_select(0, flat)
        vq = self.vq.view(-1, self.vq.shape[-1]).index_select(0, flat)
        if self.fmt == "int8":
            k = kq * self.ks.view(-1, 1).index_select(0, flat)
            v = vq * self.vs.view(-1, 1).index_select(0, flat)
        else:
            assert self.kz is not None and self.vz is not None
            blk, slot = flat // bs, flat % bs
            gi = blk * (bs // self.G) + slot // self.G
            ks = self.ks.view(-1, self.dk).index_select(0, gi)
            kz = self.kz.view(-1, self.dk).index_select(0, gi)
            k = unpack_bits(kq, self.bits) * ks + kz
            nvg = self.dv // self.VG
            vs = self.vs.view(-1, nvg).index_select(0, flat)[..., None]
            vz = self.vz.view(-1, nvg).index_select(0, flat)[..., None]
            v = (unpack_bits(vq, self.bits).view(-1, nvg, self.VG) * vs + vz).view(-1, self.dv)
            r = self.res_of.index_select(0, blk)
            fresh = (r >= 0) & (slot >= self.fill.index_select(0, blk) // self.G * self.G)
            if bool(fresh.any()):
                at = r[fresh] * bs + slot[fresh]
                k[fresh] = self.rk.view(-1, self.dk).index_select(0, at).float()
                v[fresh] = self.rv.view(-1, self.dv).index_select(0, at).float()
        return (
            self._out(k).view(*rows.shape, self.dk),
            self._out(v).view(*rows.shape, self.dv),
        )

    # -- conversion and checks ------------------------------------------------------------
    @classmethod
    def from_pool(cls, pool: KVStore, fmt: str, group: int = 32, chunk: int = 512) -> QuantKVPool:
        """A quantized copy of a float pool, every block taken as full.

        For a pool whose blocks in use are all full (the prefix cache of finished requests,
        as the policy benchmark forks it); a partial block would be quantized with the
        stale rows past its fill.
        """
        out = cls(pool.layout, pool.num_blocks, fmt, group, pool.device)
        bs = pool.layout.block_size
        for a in range(0, pool.num_blocks, chunk):
            ids = torch.arange(a, min(a + chunk, pool.num_blocks), device=pool.device)
            k, v = pool.gather(ids[:, None])
            out.write(ids[:, None] * bs + torch.arange(bs, device=pool.device), k, v)
        out._shrink()
        return out

    def check_invariants(self, used: set[int] | None = None) -> None:
        """Residual buffers: each held by one block at most, only by partially filled
        blocks, and (given the blocks in use) only by blocks in use."""
        r = self.res_of
        held = torch.nonzero(r >= 0).flatten()
        slots = r[held].tolist()
        assert len(set(slots)) == len(slots), "a residual buffer held twice"
        assert not set(slots) & set(self._res_free), "a held residual buffer is also free"
        assert len(slots) + len(self._res_free) == int(self.rk.shape[0])
        assert bool((self.fill[held] < self.bs).all()), "a full block kept its residual"
        if used is not None:
            assert set(held.tolist()) <= used, "a free block holds a residual buffer"
