"""Random operation sequences on the paged pool keep every invariant.

The pool stores, for each written slot, K = (token id, position) and V = (salt id, lane),
so the checks can read back from the real tensor that no held or cached block was
overwritten and that the hash map only points at blocks holding the hashed tokens. The
same operations run on a layout whose first layer is a sliding-window layer: its lanes
hand blocks back as the window moves, and their blocks may leave cached groups alone.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxlab.kv import KVCacheManager, KVLayout, SeqKV
from ctxlab.kv.allocator import DETACHED
from ctxlab.kv.prefix_offload import PrefixOffload

BS = 4
LAYOUT = KVLayout(n_layers=2, n_kv_heads=2, head_dim=2, head_dim_v=2, block_size=BS)
WINDOWED = KVLayout(
    n_layers=2, n_kv_heads=2, head_dim=2, head_dim_v=2, block_size=BS, windows=(5, None)
)
SALTS = [None, "tenant-a"]


class Model:
    """The test's own record of what every live sequence holds."""

    def __init__(
        self, pool_tokens: int, caching: bool, layout: KVLayout = LAYOUT, offload: bool = False
    ):
        self.layout = layout
        self.kv = KVCacheManager(layout, pool_tokens, enable_prefix_caching=caching)
        self.offload = None
        if offload:  # a host tier of 6 groups: evicted blocks come back, some fall off
            group_bytes = layout.n_lanes * layout.bytes_per_block
            self.offload = PrefixOffload(self.kv, 6 * group_bytes)
        self.seqs: list[tuple[SeqKV, list[int], int]] = []
        # hash -> (tokens of the block, first position, salt index) as the test computed it
        self.hash_content: dict[bytes, tuple[list[int], int, int]] = {}

    def write(self, seq: SeqKV, tokens: list[int], start: int, salt_i: int) -> None:
        n = len(tokens) - start
        rows = self.kv.slot_rows(seq, n)  # [lanes, n]
        lanes = torch.arange(LAYOUT.n_lanes).unsqueeze(1).expand(-1, n)
        tok = torch.tensor(tokens[start:], dtype=torch.float32).expand(LAYOUT.n_lanes, n)
        pos = torch.arange(start, len(tokens), dtype=torch.float32).expand(LAYOUT.n_lanes, n)
        k = torch.stack([tok, pos], -1)
        v = torch.stack([torch.full_like(tok, salt_i), lanes.float()], -1)
        self.kv.pool.write(rows, k, v)
        self.kv.advance(seq, n, first_pos=start)

    def start(self, tokens: list[int], salt_i: int) -> None:
        seq = self.kv.new_seq()
        salt = SALTS[salt_i]
        hit = self.kv.lookup_prefix(seq, tokens, salt)
        assert hit.num_tokens <= len(tokens) - 1
        if not self.kv.allocate(seq, len(tokens), hit, num_query_tokens=len(tokens)):
            return
        self.write(seq, tokens, hit.num_tokens, salt_i)
        self.kv.commit(seq, tokens, salt)
        self.kv.slide(seq)  # as the engine's runner does after each step
        self._record_hashes(seq, tokens, salt_i)
        self.seqs.append((seq, list(tokens), salt_i))

    def _record_hashes(self, seq: SeqKV, tokens: list[int], salt_i: int) -> None:
        for b, h in enumerate(seq.block_hashes):
            if h in self.kv.alloc.cached:
                self.hash_content.setdefault(h, (tokens[b * BS : (b + 1) * BS], b * BS, salt_i))

    def append(self, i: int, token: int) -> None:
        seq, tokens, salt_i = self.seqs[i]
        if not self.kv.allocate(seq, seq.num_tokens + 1):
            return
        tokens.append(token)
        self.write(seq, tokens, len(tokens) - 1, salt_i)
        self.kv.commit(seq, tokens, SALTS[salt_i])
        self.kv.slide(seq)
        self._record_hashes(seq, tokens, salt_i)

    def compact(self, i: int, lane: int, stride: int) -> None:
        seq, _, _ = self.seqs[i]
        if self.layout.lane_windows()[lane] is not None:
            return  # no policy compacts a sliding lane
        n = int(seq.lane_len[lane])
        keep = torch.arange(0, n, stride)
        used_before = self.kv.alloc.num_used
        held = seq.table[lane, : int(seq.n_blocks[lane])].tolist()
        shared = sum(1 for b in held if self.kv.alloc.ref[b] > 1)
        if not self.kv.compaction_fits(seq, [lane], [keep]):
            return  # its kept tokens sit in shared blocks and the pool has no room to copy
        self.kv.compact_lane(seq, lane, keep)
        # Shared blocks stay (another sequence holds them); the lane keeps its own copy.
        assert self.kv.alloc.num_used <= used_before + shared

    def free(self, i: int) -> None:
        seq, _, _ = self.seqs.pop(i)
        self.kv.free(seq)

    def check(self) -> None:
        alloc = self.kv.alloc
        owners: dict[int, int] = {}
        for seq, tokens, salt_i in self.seqs:
            held = seq.held_blocks()
            assert len(held) == len(set(held)), "a sequence holds a block twice"
            for b in held:
                owners[b] = owners.get(b, 0) + 1
            # Every slot a sequence holds still reads back its own token and position.
            windows = self.layout.lane_windows()
            for lane in range(self.layout.n_lanes):
                n = int(seq.lane_len[lane])
                slots = torch.arange(int(seq.dropped[lane]) * BS, n)
                if windows[lane] is not None:  # a sliding lane: at most its window bound
                    assert int(seq.held[lane]) <= self.layout.window_blocks(windows[lane])
                    assert int(seq.dropped[lane]) * BS <= max(0, n - windows[lane] + 1)
                else:
                    assert int(seq.dropped[lane]) == 0
                rows = seq.table[lane, slots // BS] * BS + slots % BS
                k = self.kv.pool.data[0].view(-1, 2)[rows]
                pos = slots if seq.slot_pos is None else seq.slot_pos[lane, slots]
                assert torch.equal(k[:, 1].long(), pos)
                assert torch.equal(k[:, 0].long(), torch.tensor(tokens)[pos])
                vv = self.kv.pool.data[1].view(-1, 2)[rows]
                assert torch.all(vv[:, 1] == lane)
                assert torch.all(vv[:, 0] == salt_i)
        alloc.check_invariants(owners)
        # The hash map only points at blocks holding exactly the hashed tokens.
        for h, group in alloc.cached.items():
            toks, start, salt_i = self.hash_content[h]
            for lane, b in enumerate(group):
                if b == DETACHED:
                    continue
                k = self.kv.pool.data[0][b]
                assert k[:, 0].long().tolist() == toks
                assert k[:, 1].long().tolist() == list(range(start, start + BS))
                assert torch.all(self.kv.pool.data[1][b][:, 0] == salt_i)
                assert torch.all(self.kv.pool.data[1][b][:, 1] == lane)
        stats = self.kv.stats()
        assert stats.blocks_used + stats.blocks_free == stats.blocks_total
        assert stats.prefix_cache_hits <= stats.prefix_cache_queries


op = st.one_of(
    st.tuples(
        st.just("start"),
        st.lists(st.integers(0, 2), min_size=1, max_size=14),
        st.integers(0, 1),
    ),
    st.tuples(st.just("append"), st.integers(0, 7), st.integers(0, 2)),
    st.tuples(st.just("free"), st.integers(0, 7), st.just(0)),
    st.tuples(st.just("compact"), st.integers(0, 7), st.integers(0, LAYOUT.n_lanes - 1)),
)


@pytest.mark.parametrize(
    ("layout", "offload"),
    [(LAYOUT, False), (WINDOWED, False), (LAYOUT, True)],
    ids=["full", "windowed", "offload"],
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=40), pool_tokens=st.integers(4, 40), caching=st.booleans())
def test_random_operations_keep_invariants(layout, offload, ops, pool_tokens, caching):
    m = Model(pool_tokens, caching, layout, offload=offload and caching)
    for name, a, b in ops:
        if name == "start":
            # Shared prefixes are likely: prompts are drawn from a 3-token alphabet.
            m.start(list(a), b)
        elif m.seqs:
            i = a % len(m.seqs)
            if name == "append":
                m.append(i, b)
            elif name == "free":
                m.free(i)
            else:
                m.compact(i, b, 2)
        m.check()
    for i in reversed(range(len(m.seqs))):
        m.free(i)
        m.check()
    assert m.kv.alloc.num_used == 0
    if m.offload is not None:
        st_ = m.offload.stats()
        assert st_.host_used_bytes <= 6 * layout.n_lanes * layout.bytes_per_block
        assert st_.restored_blocks * BS == st_.external_prefix_cache_hits
        m.offload.close()


def test_repeat_prompt_hits_all_full_blocks_but_the_last_token_block():
    kv = KVCacheManager(LAYOUT, 64)
    tokens = list(range(13))  # 3 full blocks + 1 token
    a = kv.new_seq()
    hit = kv.lookup_prefix(a, tokens)
    assert hit.num_tokens == 0
    assert kv.allocate(a, len(tokens), hit, len(tokens))
    kv.advance(a, len(tokens))
    kv.commit(a, tokens)
    b = kv.new_seq()
    hit = kv.lookup_prefix(b, tokens)
    assert hit.num_tokens == 12
    # 12 tokens (3 full blocks): the last token's block is never matched.
    c = kv.new_seq()
    assert kv.lookup_prefix(c, tokens[:12]).num_tokens == 8
    d = kv.new_seq()
    assert kv.lookup_prefix(d, tokens, salt="other").num_tokens == 0


def test_zero_ref_cached_block_stays_findable_until_reused():
    kv = KVCacheManager(LAYOUT, 8)  # 2 logical blocks
    tokens = [1, 2, 3, 4, 5]
    a = kv.new_seq()
    assert kv.allocate(a, 5, kv.lookup_prefix(a, tokens), 5)
    kv.advance(a, 5)
    kv.commit(a, tokens)
    kv.free(a)
    assert kv.stats().blocks_used == 0 and kv.stats().blocks_cached == 1
    b = kv.new_seq()
    assert kv.lookup_prefix(b, tokens).num_tokens == 4
    # A request that needs the whole pool reuses the cached group: it is evicted.
    c = kv.new_seq()
    other = [9] * 8
    assert kv.allocate(c, 8, kv.lookup_prefix(c, other), 8)
    assert kv.stats().cached_blocks_evicted == 1
    e = kv.new_seq()
    assert kv.lookup_prefix(e, tokens).num_tokens == 0


def test_a_restore_is_not_pushed_out_by_the_evictions_it_causes():
    """The tier holds exactly A's two blocks; restoring them takes blocks whose eviction
    sends B's two blocks to the full tier. A's blocks were claimed first, so they come back
    (the content check reads them from the pool) and B's take their place in the tier."""
    m = Model(12, True, LAYOUT)  # 3 logical blocks: one 9-token request fills the pool
    m.offload = PrefixOffload(m.kv, 2 * LAYOUT.n_lanes * LAYOUT.bytes_per_block)
    a, b = [1, 2, 0, 1, 2, 2, 1, 0, 1], [2, 2, 1, 0, 0, 1, 2, 1, 0]
    m.start(a, 0)
    m.free(0)
    m.start(b, 0)  # evicts A's two cached groups into the tier
    m.free(0)
    m.start(a, 0)
    m.check()
    st_ = m.offload.stats()
    assert st_.restored_blocks == 2 and st_.external_prefix_cache_hits == 8
    assert st_.host_blocks == 2 and not any(st_.restore_failures.values())
    assert m.kv.stats().prefix_cache_hits == 8
    m.offload.close()
