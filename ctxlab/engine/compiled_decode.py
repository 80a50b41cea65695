"""A pure decode step's attention, described per layer for the model's compiled decode block.

Why: with the layer's own work compiled (`ctxlab/model/decode_block.c`), the attention's
Python was what remained between its two calls: the pool write's checks, the read's
conversions, the kernel's argument list, some 50 us a layer inside a 4-sequence SmolLM2
step. Where a layer's attention this step is one plain kernel read (every decode row in
order, one length bucket: no policy scores, page reader, far tier or readback),
`CompiledDecode` fills a `decode_block.Attn` for it: the pool's compiled row write and the C
decode loop with their fixed arguments (taken once per pool), then this step's pool rows,
block tables, masks and lengths. The block then writes the new keys and values and runs the
attention itself, the same kernels on the same arguments as `PagedAttention.attend` would
pass (bit for bit the same step).
"""

from __future__ import annotations

import ctypes
import logging

import torch

from ctxlab.engine.kernels import c_decode
from ctxlab.engine.kernels.paged_decode import compiled_target
from ctxlab.engine.step_plan import DecodeRead, StepPlan
from ctxlab.kv.pool import KVPool
from ctxlab.kv.store import KVStore
from ctxlab.model import decode_block

log = logging.getLogger("ctxlab.engine.kernels")


class CompiledDecode:
    """The `Attn` of every layer over one pool; `prepare` fills a step's, `address` hands
    a layer's to the model (0: that layer runs `attend`)."""

    def __init__(self, pool: KVPool, n_heads: int, fixed: tuple[int, ...]) -> None:
        lay = pool.layout
        self.layout = lay
        decode, k_pool, v_pool, kw, vw = fixed[6:]
        group = n_heads // lay.n_kv_heads
        self._attn = (decode_block.Attn * lay.n_layers)()
        for a in self._attn:
            a.write, a.k_rows, a.v_rows, a.slots, a.width, a.elem = fixed[:6]
            a.decode, a.k_pool, a.v_pool = decode, k_pool, v_pool
            a.scale = float(lay.head_dim**-0.5)
            a.kv_heads, a.group, a.dv, a.bs, a.kw, a.vw = (
                lay.n_kv_heads, group, lay.head_dim_v, lay.block_size, kw, vw
            )  # fmt: skip
        self._base = ctypes.addressof(self._attn)
        self._size = ctypes.sizeof(decode_block.Attn)
        self._ready = [False] * lay.n_layers
        self._alive: list[torch.Tensor] = []  # this step's tables and lengths

    @classmethod
    def for_pool(cls, pool: KVStore, n_heads: int) -> CompiledDecode | None:
        """None where the pool or the shapes are not what the compiled path takes (a float32
        or bf16 `KVPool` on the CPU with its row write and the C decode loops built), with
        the reason logged once per reason."""
        lay = pool.layout
        why = ""
        if not isinstance(pool, KVPool):
            why = "the pool quantizes or transforms its rows as it writes them"
        elif decode_block.kernel() is None:
            why = "the compiled decode block is not built (see ctxlab.native's log)"
        elif n_heads % lay.n_kv_heads or c_decode.unsupported(
            n_heads // lay.n_kv_heads, lay.head_dim, lay.head_dim_v
        ):
            why = "the C decode loops do not take these head shapes"
        if why:
            return _refused(why)
        assert isinstance(pool, KVPool)
        writer, target = pool.row_writer(), compiled_target(pool)
        if writer is None or target is None or len(target[1]) != 2:
            return _refused("the pool's row write or the C decode loops are not in use here")
        decode, (k_pool, v_pool), kw, vw = target
        return cls(pool, n_heads, (*writer.c_target(), decode, k_pool, v_pool, kw, vw))

    def prepare(self, plan: StepPlan, tokens: int) -> None:
        """Fill this step's `Attn` of every layer whose attention is one plain kernel read
        of every row (a pure decode step, nothing asked back); mark the others."""
        self._alive = []
        self._ready = [False] * self.layout.n_layers
        asked = plan.policy
        if (
            plan.prefills
            or plan.decode_idx is None
            or plan.decode_idx.numel() != tokens
            or asked.keep_queries is not None
            or asked.record_keys
            or asked.shaped_decode
            or torch.autograd.profiler._is_profiler_enabled  # profiles name each kernel
        ):
            return
        lens_of: dict[int, torch.Tensor] = {}
        masks: dict[int, torch.Tensor] = {}  # layers often share one mask tensor
        for layer, reads in enumerate(plan.decode):
            read = reads[0] if len(reads) == 1 else None
            if read is None or not _plain(read):
                continue
            # what `paged_decode.run_kernel` passes for this read, argument for argument
            table = read.table
            if table.dtype != torch.int64 or not table.is_contiguous():
                table = table.to(torch.int64).contiguous()
            seqs, heads, nb = table.shape
            rows = plan.rows[layer]
            if seqs != tokens or not rows.is_contiguous():
                continue
            width = nb * self.layout.block_size
            mask = read.mask
            if mask is not None:
                length = min(mask.shape[-1], width)
                flat = masks.get(id(mask))
                if flat is None:
                    flat = masks[id(mask)] = mask.reshape(seqs, heads, -1).contiguous()
            else:
                length = width if read.length is None else min(read.length, width)
                flat = None
            lens = lens_of.get(length)
            if lens is None or lens.shape != (seqs, heads):
                lens = lens_of[length] = torch.full((seqs, heads), length, dtype=torch.int64)
            a = self._attn[layer]
            a.seqs, a.rows, a.table, a.lens, a.nb = (
                seqs, rows.data_ptr(), table.data_ptr(), lens.data_ptr(), nb
            )  # fmt: skip
            a.mask, a.mask_len = (None, 0) if flat is None else (flat.data_ptr(), flat.shape[-1])
            self._alive += (rows, table, lens) if flat is None else (rows, table, lens, flat)
            self._ready[layer] = True

    def address(self, layer: int) -> int:
        """The address of `layer`'s filled `Attn` this step, or 0."""
        return self._base + layer * self._size if self._ready[layer] else 0

    def finish(self) -> None:
        """The step is over: no layer's description stays usable."""
        self._ready = [False] * self.layout.n_layers
        self._alive = []


_said: set[str] = set()


def _refused(why: str) -> None:
    if why not in _said:
        _said.add(why)
        log.info("decode steps run each layer's attention from Python: %s", why)
    return None


def _plain(read: DecodeRead) -> bool:
    """One kernel read of every decode row, in order."""
    return (
        read.path == "kernel"
        and read.rows is None
        and (read.mask is None or read.mask.dtype == torch.bool)
        and not (read.want_probs or read.pages or read.far)
        and read.extra is None
    )
