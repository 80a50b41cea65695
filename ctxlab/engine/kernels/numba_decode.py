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

# Every fast-math flag (LLVM vectorises the dot products and the exps' arguments); so no
# infinities anywhere: an empty max and a masked score are NEG, a finite sentinel.
_FM = True
NEG = np.float32(-3.0e38)


@njit(cache=True, fastmath=_FM, inline="always")
def _block(qs, krows, vrows, n_slots, mrow, use_mask, t0, m, den, acc, sc):
    """Fold one block (`krows [bs, >=d]`, `vrows [bs, >=dv]`, C-contiguous rows) into the
    running softmax of the g queries `qs [g, d]` (already scaled): scores, one rescale of
    the sums if the max rose, then the weighted values."""
    g, d = qs.shape
    dv = acc.shape[1]
    for gi in range(g):
        bmax = NEG
        for s in range(n_slots):
            dot = np.float32(0.0)
            for c in range(d):
                dot += qs[gi, c] * krows[s, c]
            if use_mask and not mrow[t0 + s]:
                dot = NEG
            sc[gi, s] = dot
            bmax = max(bmax, dot)
        if bmax == NEG:
            sc[gi, :n_slots] = 0.0
            continue
        m_old = m[gi]
        if bmax > m_old:
            corr = np.float32(np.exp(m_old - bmax))
            den[gi] *= corr
            for c in range(dv):
                acc[gi, c] *= corr
            m[gi] = bmax
        mg = m[gi]
        tot = np.float32(0.0)
        for s in range(n_slots):
            x = sc[gi, s]
            p = np.float32(np.exp(x - mg)) if x != NEG else np.float32(0.0)
            sc[gi, s] = p
            tot += p
        den[gi] += tot
    for s in range(n_slots):
        for gi in range(g):
            p = sc[gi, s]
            if p != 0.0:
                for c in range(dv):
                    acc[gi, c] += p * vrows[s, c]


@njit(cache=True, fastmath=_FM, inline="always")
def _start(q, b, h, scale, bs, dv):
    """A lane's scaled queries `[g, d]` and empty softmax state (max, denominator, sums)."""
    g, d = q.shape[2], q.shape[3]
    qs = np.empty((g, d), dtype=np.float32)
    for gi in range(g):
        for c in range(d):
            qs[gi, c] = q[b, h, gi, c] * scale
    m = np.full(g, NEG, dtype=np.float32)
    den = np.zeros(g, dtype=np.float32)
    acc = np.zeros((g, dv), dtype=np.float32)
    sc = np.empty((g, bs), dtype=np.float32)
    return qs, m, den, acc, sc


@njit(cache=True, fastmath=_FM, inline="always")
def _finish(out, b, h, m, den, acc):
    g, dv = acc.shape
    for gi in range(g):
        inv = np.float32(1.0) / den[gi] if den[gi] > 0 else np.float32(0.0)
        for c in range(dv):
            out[b, h, gi, c] = acc[gi, c] * inv


@njit(cache=True, fastmath=_FM)
def decode_f32(q, kp, vp, table, lens, mask, use_mask, scale, out):
    """Float32 pool `kp`, `vp [blocks, bs, width]`, rows read where they lie."""
    B, H = q.shape[0], q.shape[1]
    bs, dv = kp.shape[1], out.shape[3]
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        qs, m, den, acc, sc = _start(q, b, h, scale, bs, dv)
        mrow = mask[b, h] if use_mask else mask[0, 0]
        n = lens[b, h]
        for j in range((n + bs - 1) // bs):
            blk = table[b, h, j]
            _block(qs, kp[blk], vp[blk], min(bs, n - j * bs), mrow, use_mask, j * bs, m, den,
                   acc, sc)  # fmt: skip
        _finish(out, b, h, m, den, acc)


@njit(cache=True, fastmath=_FM)
def decode_bf16(q, kp, vp, table, lens, mask, use_mask, scale, out):
    """bfloat16 pool read as uint16 patterns `[blocks, bs, width]`, widened per block."""
    B, H, d = q.shape[0], q.shape[1], q.shape[3]
    bs, dv = kp.shape[1], out.shape[3]
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        qs, m, den, acc, sc = _start(q, b, h, scale, bs, dv)
        mrow = mask[b, h] if use_mask else mask[0, 0]
        kb = np.empty((bs, d), dtype=np.uint32)
        vb = np.empty((bs, dv), dtype=np.uint32)
        kf, vf = kb.view(np.float32), vb.view(np.float32)
        n = lens[b, h]
        for j in range((n + bs - 1) // bs):
            ns = min(bs, n - j * bs)
            blk = table[b, h, j]
            for s in range(ns):
                for c in range(d):
                    kb[s, c] = np.uint32(kp[blk, s, c]) << np.uint32(16)
                for c in range(dv):
                    vb[s, c] = np.uint32(vp[blk, s, c]) << np.uint32(16)
            _block(qs, kf, vf, ns, mrow, use_mask, j * bs, m, den, acc, sc)
        _finish(out, b, h, m, den, acc)


@njit(cache=True, fastmath=_FM)
def decode_int8(q, kq, ks, vq, vs, table, lens, mask, use_mask, scale, out):
    """int8 pool: codes `kq [blocks, bs, d]`, one float32 scale per row `ks [blocks, bs]`."""
    B, H, d = q.shape[0], q.shape[1], q.shape[3]
    bs, dv = kq.shape[1], out.shape[3]
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        qs, m, den, acc, sc = _start(q, b, h, scale, bs, dv)
        mrow = mask[b, h] if use_mask else mask[0, 0]
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
            _block(qs, kf, vf, ns, mrow, use_mask, j * bs, m, den, acc, sc)
        _finish(out, b, h, m, den, acc)


KERNELS = {"f32": decode_f32, "bf16": decode_bf16, "int8": decode_int8}
