"""Batched compaction does exactly what the manager's one-lane `compact_lane` does.

Two identical managers hold the same sequences (one sharing a prefix block with another);
random keep sets are applied lane by lane through `KVCacheManager.compact_lane` on one and
all at once through `compact_lanes` on the other. Every lane must then read back the same
K/V, positions, lengths and block counts, the allocators must agree on what is in use, and
the shared prefix must be unchanged.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.kv import KVCacheManager, KVLayout
from ctxlab.policy.base import keep_to_slots
from ctxlab.policy.compact import compact_lanes, keep_to_slots_batched

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
def test_batched_compaction_equals_lane_by_lane(lengths, seed, shift):
    kv_a, seqs_a = _filled(lengths)
    kv_b = copy.deepcopy(kv_a)
    seqs_b = [copy.deepcopy(s) for s in seqs_a]
    shared_before = kv_a.pool.data.clone()
    cached = [b for g in kv_a.alloc.cached.values() for b in g]
    gen = torch.Generator().manual_seed(seed)
    rope = ShiftRope() if shift else None
    for sa, sb in zip(seqs_a, seqs_b, strict=True):
        lanes, keep = [], []
        for lane in range(LAYOUT.n_lanes):
            n = int(sa.lane_len[lane])
            if torch.rand(1, generator=gen) < 0.3:
                continue  # some lanes are not cut
            k = int(torch.randint(1, n + 1, (1,), generator=gen))
            slots = torch.sort(torch.randperm(n, generator=gen)[:k]).values
            lanes.append(lane)
            keep.append(slots)
            kv_a.compact_lane(sa, lane, slots)
            if rope is not None:  # the driver's old per-lane re-rotation, by hand
                rows = sa.table[lane, : -(-k // BS)].repeat_interleave(BS)[:k] * BS
                rows = rows + torch.arange(k) % BS
                delta = torch.arange(k) - slots
                kv_a.pool._k_rows[rows] = rope.shift_keys(kv_a.pool._k_rows[rows][:, None], delta)[
                    :, 0
                ]
        compact_lanes(kv_b, sb, lanes, keep, rope)
        for lane in range(LAYOUT.n_lanes):
            for x, y in zip(_lane(kv_a, sa, lane), _lane(kv_b, sb, lane), strict=True):
                assert torch.equal(x, y)
        assert torch.equal(sa.lane_len, sb.lane_len) and torch.equal(sa.n_blocks, sb.n_blocks)
        assert sa.lockstep == sb.lockstep
    assert kv_a.alloc.num_used == kv_b.alloc.num_used
    kv_b.alloc.check_invariants()
    for b in cached:  # the shared prefix block was never written
        if kv_b.alloc.is_cached(b):
            assert torch.equal(kv_b.pool.data[:, b], shared_before[:, b])


def test_keep_to_slots_batched_matches_one_lane():
    pos = torch.tensor([[0, 3, 7, 9, -1, -1], [1, 2, 5, 6, 8, 11]])
    keep = [torch.tensor([3, 9]), torch.tensor([1, 6, 11])]
    got = keep_to_slots_batched(pos, keep)
    assert [g.tolist() for g in got] == [keep_to_slots(pos[i], keep[i]).tolist() for i in (0, 1)]
    assert [g.tolist() for g in got] == [[1, 3], [0, 3, 5]]
    with pytest.raises(RuntimeError):
        keep_to_slots_batched(pos, [torch.tensor([4]), torch.tensor([1])])
    with pytest.raises(RuntimeError):
        keep_to_slots_batched(pos, [torch.tensor([3]), torch.tensor([12])])
