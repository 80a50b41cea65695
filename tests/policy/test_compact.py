"""`KVCacheManager.compact_lanes` against what each lane held before it.

Sequences (two sharing a prefix block) get random keep sets on random lanes, all lanes of a
sequence in one call. Every lane must then read back exactly the K/V and positions it held
at the kept slots (keys re-rotated by the slot shift with a RoPE stand-in), in
ceil(kept / block) blocks of its own; the allocator's invariants hold, the blocks in use
are exactly what the sequences hold, and the shared prefix blocks are never written.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.kv import KVCacheManager, KVLayout

BS = 4
LAYOUT = KVLayout(n_layers=2, n_kv_heads=3, head_dim=4, head_dim_v=4, block_size=BS)


class ShiftRope:
    """A stand-in for RoPE's `shift_keys`: adds the shift to every channel (easy to check)."""

    def shift_keys(self, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return k + delta.view(-1, 1, 1).to(k.dtype)


def _filled(lengths: list[int]) -> tuple[KVCacheManager, list]:
    kv = KVCacheManager(LAYOUT, 256, enable_prefix_caching=True)
    seqs = []
    shared = list(range(100, 100 + 2 * BS))
    for i, n in enumerate(lengths):
        tokens = shared + [i * 1000 + t for t in range(n)]
        seq = kv.new_seq()
        hit = kv.lookup_prefix(seq, tokens)
        assert kv.allocate(seq, len(tokens), hit, num_query_tokens=len(tokens))
        start = hit.num_tokens
        m = len(tokens) - start
        rows = kv.slot_rows(seq, m)
        vals = torch.tensor(tokens[start:], dtype=torch.float32)
        k = vals.view(1, m, 1) + torch.arange(LAYOUT.n_lanes).view(-1, 1, 1) * 0.25
        k = k.expand(-1, -1, LAYOUT.head_dim).contiguous()
        kv.pool.write(rows, k, -k)
        kv.advance(seq, m, first_pos=start)
        kv.commit(seq, tokens)
        seqs.append(seq)
    return kv, seqs


def _lane(kv: KVCacheManager, seq, lane: int) -> tuple[torch.Tensor, ...]:
    n = int(seq.lane_len[lane])
    k, v = kv.pool.gather(seq.table[lane : lane + 1, : -(-n // BS)])
    pos = seq.slot_pos[lane, :n] if seq.slot_pos is not None else torch.arange(n)
    return k[0, :n], v[0, :n], pos.clone()


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=2, max_size=3),
    seed=st.integers(0, 10_000),
    shift=st.booleans(),
)
def test_compaction_keeps_exactly_the_kept_slots(lengths, seed, shift):
    kv, seqs = _filled(lengths)
    shared_before = kv.pool.data.clone()
    cached = [b for g in kv.alloc.cached.values() for b in g]
    gen = torch.Generator().manual_seed(seed)
    rope = ShiftRope() if shift else None
    for seq in seqs:
        before = [_lane(kv, seq, lane) for lane in range(LAYOUT.n_lanes)]
        lanes, keep = [], []
        for lane in range(LAYOUT.n_lanes):
            n = int(seq.lane_len[lane])
            if torch.rand(1, generator=gen) < 0.3:
                continue  # some lanes are not cut
            k = int(torch.randint(1, n + 1, (1,), generator=gen))
            lanes.append(lane)
            keep.append(torch.sort(torch.randperm(n, generator=gen)[:k]).values)
        kv.compact_lanes(seq, lanes, keep, rope)
        cut = dict(zip(lanes, keep, strict=True))
        for lane in range(LAYOUT.n_lanes):
            k0, v0, p0 = before[lane]
            slots = cut.get(lane, torch.arange(len(p0)))
            k1, v1, p1 = _lane(kv, seq, lane)
            want_k = k0[slots]
            if rope is not None and lane in cut:
                want_k = rope.shift_keys(want_k[:, None], torch.arange(len(slots)) - slots)[:, 0]
            assert torch.equal(k1, want_k) and torch.equal(v1, v0[slots])
            assert torch.equal(p1, p0[slots])
            if lane in cut:
                assert int(seq.n_blocks[lane]) == -(-len(slots) // BS)
        if lanes:
            assert not seq.lockstep
    kv.alloc.check_invariants()
    held = {b for seq in seqs for b in seq.held_blocks()}
    assert kv.alloc.num_used == len(held), "every block nobody holds went back to the pool"
    for b in cached:  # the shared prefix block was never written
        if kv.alloc.is_cached(b):
            assert torch.equal(kv.pool.data[:, b], shared_before[:, b])
