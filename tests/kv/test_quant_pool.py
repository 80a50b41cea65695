"""The quantized pool (`QuantKVPool`): error bounds, exact bytes, and random operation
sequences checked against the pure reference quantizer (`ctxlab.policy.quant.QuantKV`).

The reference sees, per lane, the rows the lane holds as the pool was last given them
(written tokens; after a compaction, the dequantized rows the compaction read) and
quantizes them in groups of `group` lane slots; the pool must return exactly its
dequantized values (bit for bit), hold exactly one full-precision residual buffer per
lane whose last block is partially filled, never change a prefix-cached block, and
return every residual buffer when its block fills or is freed.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxlab.errors import CtxlabError
from ctxlab.kv import KVCacheManager, KVLayout, KVPool, QuantKVPool, SeqKV
from ctxlab.kv.quantize import kv_bytes
from ctxlab.policy.quant import QuantKV

FORMATS = ("int8", "kivi4", "kivi2")


def lane_rows(layout: KVLayout, blocks: list[int], n: int) -> torch.Tensor:
    bs = layout.block_size
    i = torch.arange(n)
    return torch.tensor(blocks)[i // bs] * bs + i % bs


# -- round trip and bytes -----------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block", [16, 32])
def test_round_trip_error_bounds(fmt, block):
    torch.manual_seed(block)
    lay = KVLayout(1, 1, 64, 64, block_size=block)
    pool = QuantKVPool(lay, 8, fmt)
    n = 3 * block + 5  # three full blocks and a partial one
    k = torch.randn(n, 64) * 2 + torch.linspace(-3, 3, 64)  # channel offsets, as real keys
    v = torch.randn(n, 64)
    rows = lane_rows(lay, [6, 1, 4, 2], n)
    for a in range(0, n, 7):  # written in chunks that straddle groups and blocks
        pool.write(rows[a : a + 7], k[a : a + 7], v[a : a + 7])
    gk, gv = pool.gather(torch.tensor([[6, 1, 4, 2]]))
    gk, gv = gk[0, :n], gv[0, :n]
    rk, rv = pool.read_rows(rows)
    assert torch.equal(gk, rk) and torch.equal(gv, rv)
    eps = 1e-5
    if fmt == "int8":  # per token: half a step of absmax / 127
        for x, y in ((k, gk), (v, gv)):
            step = x.abs().amax(-1, keepdim=True) / 127
            assert torch.all((y - x).abs() <= step / 2 + eps)
        return
    levels = 15 if fmt == "kivi4" else 3
    G, q = pool.G, n // pool.G * pool.G
    assert min(block, 32) == G
    kg = k[:q].view(-1, G, 64)  # keys: per channel over G tokens
    step_k = (kg.amax(1, keepdim=True) - kg.amin(1, keepdim=True)) / levels
    assert torch.all((gk[:q].view(-1, G, 64) - kg).abs() <= step_k / 2 + eps)
    vg = v[:q].view(q, 2, 32)  # values: per token over 32 channels
    step_v = (vg.amax(2, keepdim=True) - vg.amin(2, keepdim=True)) / levels
    assert torch.all((gv[:q].view(q, 2, 32) - vg).abs() <= step_v / 2 + eps)
    # The unfinished group is in full precision, exactly as written.
    assert torch.equal(gk[q:], k[q:]) and torch.equal(gv[q:], v[q:])
    assert pool.residual_blocks == 1


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block", [16, 32])
def test_resident_bytes_match_the_formula(fmt, block):
    lay = KVLayout(2, 3, 64, 64, block_size=block)
    kv = KVCacheManager(lay, 40 * block, enable_prefix_caching=False, kv_format=fmt)
    pool = kv.pool
    G = pool.G if fmt != "int8" else block
    # Bytes per block are measured from the tensors and equal the formula for one block.
    assert pool.block_bytes == kv_bytes(block, 64, 64, fmt, G, 4, pool.VG)
    assert pool.block_bytes < lay.bytes_per_block
    torch.manual_seed(0)
    seqs: list[tuple[SeqKV, int]] = []
    for n in (1, block - 1, block, 2 * block + 3, 5 * block):
        seq = kv.new_seq()
        assert kv.allocate(seq, n)
        rows = kv.slot_rows(seq, n)
        pool.write(rows, torch.randn(lay.n_lanes, n, 64), torch.randn(lay.n_lanes, n, 64))
        kv.advance(seq, n)
        seqs.append((seq, n))
    total = 0
    for seq, n in seqs:
        lane = kv.resident_bytes(seq) // lay.n_lanes
        formula = kv_bytes(n, 64, 64, fmt, G, 4, pool.VG)
        partial = n % block != 0 and fmt != "int8"
        assert lane == -(-n // block) * pool.block_bytes + partial * pool.residual_block_bytes
        if fmt == "int8":  # whole blocks of int8 rows plus one scale per row and tensor
            assert lane == -(-n // block) * block * (64 + 64 + 2 * 4)
        elif n % block == 0:
            assert lane == formula
        # At most one full-precision partial block (plus its unused codes) over the formula.
        assert formula <= lane <= formula + pool.block_bytes + pool.residual_block_bytes
        total += kv.resident_bytes(seq)
    assert kv.resident_bytes() == total == kv.stats().resident_bytes
    if block == 32 and fmt != "int8":  # KIVI's own group of 32: the pure QuantKV agrees
        ref = QuantKV(fmt, 64, 64, group=32, n=1)
        ref.append(torch.randn(1, 5 * block, 64), torch.randn(1, 5 * block, 64))
        assert ref.nbytes == 5 * pool.block_bytes
    for seq, _ in seqs:
        kv.free(seq)
    assert kv.resident_bytes() == 0 and pool.residual_blocks == 0


def test_formats_and_shapes_are_checked():
    lay = KVLayout(1, 1, 64, 64, block_size=16)
    with pytest.raises(CtxlabError):
        QuantKVPool(lay, 4, "int4")
    with pytest.raises(CtxlabError):
        QuantKVPool(KVLayout(1, 1, 66, 64, block_size=16), 4, "kivi2")  # 66 % 4 != 0
    pool = QuantKVPool(lay, 4, "kivi4", group=32)
    assert (pool.G, pool.VG) == (16, 32)  # a key group never spans two blocks


def test_from_pool_equals_writing_full_blocks():
    lay = KVLayout(1, 2, 8, 8, block_size=4)
    torch.manual_seed(1)
    src = KVPool(lay, 6)
    rows = torch.arange(24)
    k, v = torch.randn(24, 8), torch.randn(24, 8)
    src.write(rows, k, v)
    direct = QuantKVPool(lay, 6, "kivi2", group=4)
    direct.write(rows, k, v)
    conv = QuantKVPool.from_pool(src, "kivi2", group=4)
    ids = torch.arange(6)[:, None]
    assert all(torch.equal(a, b) for a, b in zip(conv.gather(ids), direct.gather(ids), strict=True))
    assert conv.residual_blocks == 0 and conv.nbytes == 6 * conv.block_bytes


# -- random operations against the reference quantizer -------------------------------------
D = 8
SALTS = [None, "tenant-a"]


def values(tokens: list[int], i: int, lane: int, salt_i: int) -> tuple[list[float], ...]:
    """K and V of the token at position i: a function of the prefix (as in a real model)."""
    rng = random.Random(hash((tuple(tokens[: i + 1]), lane, salt_i)))
    return tuple([rng.gauss(0, 1) * (c + 1) for c in range(D)] for _ in range(2))


class Model:
    def __init__(self, fmt: str, bs: int, group: int, pool_tokens: int, caching: bool):
        self.lay = KVLayout(1, 2, D, D, block_size=bs)
        self.kv = KVCacheManager(self.lay, pool_tokens, caching, kv_format=fmt, kv_group=group)
        self.fmt, self.group = fmt, group
        # per live sequence: (seq, tokens, salt, raw rows per lane [(k, v) lists])
        self.seqs: list[tuple[SeqKV, list[int], int, list[list[tuple]]]] = []
        self.cached: dict[bytes, tuple[tuple[int, ...], torch.Tensor]] = {}

    def write(self, entry, start: int) -> None:
        seq, tokens, salt_i, raw = entry
        n = len(tokens) - start
        rows = self.kv.slot_rows(seq, n)
        k = torch.empty(self.lay.n_lanes, n, D)
        v = torch.empty(self.lay.n_lanes, n, D)
        for lane in range(self.lay.n_lanes):
            for j in range(n):
                kk, vv = values(tokens, start + j, lane, salt_i)
                k[lane, j], v[lane, j] = torch.tensor(kk), torch.tensor(vv)
                raw[lane].append((k[lane, j], v[lane, j]))
        self.kv.pool.write(rows, k, v)
        self.kv.advance(seq, n, first_pos=start)
        self.kv.commit(seq, tokens, SALTS[salt_i])

    def start(self, tokens: list[int], salt_i: int) -> None:
        seq = self.kv.new_seq()
        hit = self.kv.lookup_prefix(seq, tokens, SALTS[salt_i])
        if not self.kv.allocate(seq, len(tokens), hit, len(tokens)):
            return
        raw: list[list[tuple]] = [[] for _ in range(self.lay.n_lanes)]
        for lane in range(self.lay.n_lanes):  # the shared blocks hold the same prefix values
            for i in range(hit.num_tokens):
                kk, vv = values(tokens, i, lane, salt_i)
                raw[lane].append((torch.tensor(kk), torch.tensor(vv)))
        entry = (seq, list(tokens), salt_i, raw)
        self.write(entry, hit.num_tokens)
        self.seqs.append(entry)

    def append(self, i: int, token: int) -> None:
        entry = self.seqs[i]
        seq, tokens = entry[0], entry[1]
        if not self.kv.allocate(seq, seq.num_tokens + 1):
            return
        tokens.append(token)
        self.write(entry, len(tokens) - 1)

    def expected(self, raw_lane: list[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
        ref = QuantKV(self.fmt, D, D, group=self.group, n=1)
        if raw_lane:
            ref.append(
                torch.stack([r[0] for r in raw_lane])[None],
                torch.stack([r[1] for r in raw_lane])[None],
            )
        k, v = ref.dequantize()
        return k[0], v[0]

    def compact(self, i: int, lanes: list[int], stride: int, batched: bool) -> None:
        seq, _, _, raw = self.seqs[i]
        keeps = []
        for lane in lanes:
            n = int(seq.lane_len[lane])
            keep = torch.arange((n - 1) % stride, n, stride)  # the last slot is always kept
            ek, ev = self.expected(raw[lane])
            raw[lane] = [(ek[j], ev[j]) for j in keep.tolist()]  # what the compaction reads
            keeps.append(keep)
        if batched:
            self.kv.compact_lanes(seq, lanes, keeps)
        else:
            for lane, keep in zip(lanes, keeps, strict=True):
                self.kv.compact_lane(seq, lane, keep)

    def free(self, i: int) -> None:
        self.kv.free(self.seqs.pop(i)[0])

    def check(self) -> None:
        kv, pool, bs = self.kv, self.kv.pool, self.lay.block_size
        used = {b for b in range(pool.num_blocks) if kv.alloc.ref[b] > 0}
        pool.check_invariants(used)
        partial = set()
        for seq, _, _, raw in self.seqs:
            for lane in range(self.lay.n_lanes):
                n, nb = int(seq.lane_len[lane]), int(seq.n_blocks[lane])
                assert n == len(raw[lane])
                ids = seq.table[lane, :nb]
                gk, gv = pool.gather(ids[None])
                ek, ev = self.expected(raw[lane])
                assert torch.equal(gk[0, :n], ek) and torch.equal(gv[0, :n], ev)
                rk, rv = pool.read_rows(lane_rows(self.lay, ids.tolist(), n))
                assert torch.equal(rk, ek) and torch.equal(rv, ev)
                if n % bs and self.fmt != "int8":
                    partial.add(int(ids[-1]))
        # Exactly the partial last blocks hold full-precision rows; bytes follow.
        assert pool.residual_blocks == len(partial)
        held = torch.nonzero(pool.res_of >= 0).flatten().tolist()
        assert set(held) == partial
        rb = len(partial) * pool.residual_block_bytes
        assert kv.resident_bytes() == len(used) * pool.block_bytes + rb
        # Prefix-cached blocks are never written again while they stay cached.
        for h, g in kv.alloc.cached.items():
            content = torch.cat(pool.gather(torch.tensor(g)[:, None]), -1)
            if h in self.cached and self.cached[h][0] == g:
                assert torch.equal(self.cached[h][1], content), "a cached block changed"
            self.cached[h] = (g, content)


op = st.one_of(
    st.tuples(
        st.just("start"), st.lists(st.integers(0, 2), min_size=1, max_size=14), st.integers(0, 1)
    ),
    st.tuples(st.just("append"), st.integers(0, 7), st.integers(0, 2)),
    st.tuples(st.just("free"), st.integers(0, 7), st.just(0)),
    st.tuples(st.just("compact"), st.integers(0, 7), st.integers(0, 3)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(FORMATS),
    shape=st.sampled_from([(4, 4), (8, 4), (8, 8)]),  # (block size, group): G == or < block
    ops=st.lists(op, max_size=30),
    pool_tokens=st.integers(8, 48),
    caching=st.booleans(),
)
def test_random_operations_match_the_reference_quantizer(fmt, shape, ops, pool_tokens, caching):
    bs, group = shape
    m = Model(fmt, bs, group, pool_tokens, caching)
    for name, a, b in ops:
        if name == "start":  # a 3-token alphabet: shared prefixes are likely
            m.start(list(a), b)
        elif m.seqs:
            i = a % len(m.seqs)
            if name == "append":
                m.append(i, b)
            elif name == "free":
                m.free(i)
            else:  # b: which lanes (one or both), stride 2 or 3, batched or one by one
                lanes = [b % 2] if b < 2 else [0, 1]
                m.compact(i, lanes, 2 + b % 2, batched=b >= 2)
        m.check()
    while m.seqs:
        m.free(len(m.seqs) - 1)
        m.check()
    assert m.kv.alloc.num_used == 0 and m.kv.pool.residual_blocks == 0
