"""numba loops of the paged decode attention (imported only when numba is importable).

Each (sequence, KV head) lane walks its block table and reads K and V rows where they lie in
the pool, block by block, with an online softmax over the g query heads that share the KV
head (GQA without repeating K/V). Scores of one block are computed, the running max is
raised once per block, then the block's values are accumulated: one pass over the lane's
bytes. Float pools are read as they are (bf16 as its 16-bit patterns, widened in the loop);
int8 pools are dequantized in the loop (code x row scale), never into a float copy.

`lens[b, h]` bounds the slots read; `mask[b, h, t]` (when `use_mask`) says which of them are
keys, so holes (blocks given back, compacted lanes) are skipped without being read.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

# reassoc lets LLVM vectorise the dot products; no nnan/ninf: -inf marks an empty max.
_FM = {"reassoc", "contract", "arcp", "nsz"}


@njit(cache=True, fastmath=_FM, inline="always")
def _block(q, bh_b, bh_h, krows, vrows, n_slots, mask, use_mask, t0, scale, m, den, acc, sc):
    """Fold one block (`krows`, `vrows` float32 `[bs, d]`) into the running softmax."""
    g, d = q.shape[2], q.shape[3]
    dv = acc.shape[1]
    for gi in range(g):
        bmax = -np.inf
        for s in range(n_slots):
            if use_mask and not mask[bh_b, bh_h, t0 + s]:
                sc[gi, s] = -np.inf
                continue
            dot = np.float32(0.0)
            for c in range(d):
                dot += q[bh_b, bh_h, gi, c] * krows[s, c]
            x = dot * scale
            sc[gi, s] = x
            if x > bmax:
                bmax = x
        if bmax == -np.inf:
            continue
        m_new = max(m[gi], bmax)
        corr = np.float32(np.exp(m[gi] - m_new)) if m[gi] != -np.inf else np.float32(0.0)
        if corr != 1.0:
            den[gi] *= corr
            for c in range(dv):
                acc[gi, c] *= corr
        m[gi] = m_new
        for s in range(n_slots):
            x = sc[gi, s]
            if x == -np.inf:
                continue
            p = np.float32(np.exp(x - m_new))
            den[gi] += p
            for c in range(dv):
                acc[gi, c] += p * vrows[s, c]


@njit(cache=True, fastmath=_FM, inline="always")
def _finish(out, b, h, m, den, acc):
    g, dv = acc.shape
    for gi in range(g):
        inv = np.float32(1.0) / den[gi] if den[gi] > 0 else np.float32(0.0)
        for c in range(dv):
            out[b, h, gi, c] = acc[gi, c] * inv


@njit(cache=True, fastmath=_FM)
def decode_f32(q, kp, vp, table, lens, mask, use_mask, scale, out):
    """Float32 pool `kp`, `vp [blocks, bs, width]`."""
    B, H, g, d = q.shape
    bs = kp.shape[1]
    dv = out.shape[3]
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        m = np.full(g, -np.inf, dtype=np.float32)
        den = np.zeros(g, dtype=np.float32)
        acc = np.zeros((g, dv), dtype=np.float32)
        sc = np.empty((g, bs), dtype=np.float32)
        n = lens[b, h]
        for j in range((n + bs - 1) // bs):
            ns = min(bs, n - j * bs)
            blk = table[b, h, j]
            _block(q, b, h, kp[blk, :, :d], vp[blk, :, :dv], ns, mask, use_mask, j * bs,
                   scale, m, den, acc, sc)  # fmt: skip
        _finish(out, b, h, m, den, acc)


@njit(cache=True, fastmath=_FM)
def decode_bf16(q, kp, vp, table, lens, mask, use_mask, scale, out):
    """bfloat16 pool read as uint16 patterns `[blocks, bs, width]`, widened per block."""
    B, H, g, d = q.shape
    bs = kp.shape[1]
    dv = out.shape[3]
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        m = np.full(g, -np.inf, dtype=np.float32)
        den = np.zeros(g, dtype=np.float32)
        acc = np.zeros((g, dv), dtype=np.float32)
        sc = np.empty((g, bs), dtype=np.float32)
        kb = np.empty((bs, d), dtype=np.uint32)
        vb = np.empty((bs, dv), dtype=np.uint32)
        kf = kb.view(np.float32)
        vf = vb.view(np.float32)
        n = lens[b, h]
        for j in range((n + bs - 1) // bs):
            ns = min(bs, n - j * bs)
            blk = table[b, h, j]
            for s in range(ns):
                for c in range(d):
                    kb[s, c] = np.uint32(kp[blk, s, c]) << np.uint32(16)
                for c in range(dv):
                    vb[s, c] = np.uint32(vp[blk, s, c]) << np.uint32(16)
            _block(q, b, h, kf, vf, ns, mask, use_mask, j * bs, scale, m, den, acc, sc)
        _finish(out, b, h, m, den, acc)


@njit(cache=True, fastmath=_FM)
def decode_int8(q, kq, ks, vq, vs, table, lens, mask, use_mask, scale, out):
    """int8 pool: codes `kq [blocks, bs, d]`, one float32 scale per row `ks [blocks, bs]`."""
    B, H, g, d = q.shape
    bs = kq.shape[1]
    dv = out.shape[3]
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        m = np.full(g, -np.inf, dtype=np.float32)
        den = np.zeros(g, dtype=np.float32)
        acc = np.zeros((g, dv), dtype=np.float32)
        sc = np.empty((g, bs), dtype=np.float32)
        kf = np.empty((bs, d), dtype=np.float32)
        vf = np.empty((bs, dv), dtype=np.float32)
        n = lens[b, h]
        for j in range((n + bs - 1) // bs):
            ns = min(bs, n - j * bs)
            blk = table[b, h, j]
            for s in range(ns):
                a = ks[blk, s]
                for c in range(d):
                    kf[s, c] = np.float32(kq[blk, s, c]) * a
                a = vs[blk, s]
                for c in range(dv):
                    vf[s, c] = np.float32(vq[blk, s, c]) * a
            _block(q, b, h, kf, vf, ns, mask, use_mask, j * bs, scale, m, den, acc, sc)
        _finish(out, b, h, m, den, acc)


KERNELS = {"f32": decode_f32, "bf16": decode_bf16, "int8": decode_int8}


def parallel_variant(kind: str):
    """The same loop with `prange` across lanes in parallel (not cached; for measuring)."""
    return njit(fastmath=_FM, parallel=True)(KERNELS[kind].py_func)
