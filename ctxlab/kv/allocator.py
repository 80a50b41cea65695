"""Physical blocks: reference counts, the LRU free queue and the prefix hash map.

Invariants (checked by `check_invariants`, exercised by the property tests):
- every block is either in use (ref > 0) or in the free queue (ref == 0), never both, so
  free + used == total;
- a block's reference count equals the number of owners holding it;
- the hash map points a block hash at a group (one physical block per lane) whose blocks
  all carry that hash; a block carries a hash only while its group is in the map;
- a cached block whose count drops to zero stays in the map (findable) until the free queue
  hands it out again; at that moment its whole group leaves the map (an eviction), unless
  it sits at a `detachable` position of its group (a sliding-window lane): then only that
  block leaves the group (its entry becomes `DETACHED`) and the group stays findable;
- `DETACHED` entries appear only at detachable positions.
Blocks freed last are reused last (LRU), and a sequence frees its tail first, so the
start of a prefix (shared most often) survives longest.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from ctxlab.errors import CtxlabError
from ctxlab.kv.block_events import BlockEvents
from ctxlab.kv.hashing import BlockHash

# A group's entry for a block that left it (a sliding lane's block handed out again).
DETACHED = -1


class BlockAllocator:
    def __init__(self, num_blocks: int, detachable: frozenset[int] = frozenset()):
        """`detachable`: positions in a group (lanes) whose block may leave the group alone;
        a prefix hit checks that the ones it needs are still there."""
        if num_blocks <= 0:
            raise CtxlabError("the KV pool has no blocks; give it at least one block per lane.")
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.cached: dict[BlockHash, tuple[int, ...]] = {}
        self.detachable = detachable
        self.evicted_groups = 0
        self.detached_blocks = 0
        # Told which blocks just lost their last reference (a quantized pool drops the
        # full-precision rows of a partially filled block there).
        self.on_free: Callable[[list[int]], None] | None = None
        # Told which group left the map (hash, blocks) before its blocks are handed out:
        # the prefix cache's offload tier copies it out there (`ctxlab.kv.prefix_offload`).
        self.on_evict: Callable[[BlockHash, tuple[int, ...]], None] | None = None
        # Told every store into and removal from the hash map (KV events, when published).
        self.events: BlockEvents | None = None

    # -- counts ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (including cached blocks nobody holds)."""
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def num_cached_groups(self) -> int:
        return len(self.cached)

    # -- allocation -----------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Take `n` blocks from the head of the free queue (ref 1 each), evicting as needed."""
        if n > len(self.free):
            raise CtxlabError(f"the KV pool has {len(self.free)} free blocks, {n} were asked.")
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:
                self._leave(h, b)
            self.ref[b] = 1
            out.append(b)
        return out

    def _leave(self, h: BlockHash, b: int) -> None:
        """Block `b` of group `h` is handed out: it alone leaves a detachable position,
        otherwise the whole group leaves the map."""
        group = self.cached[h]
        at = group.index(b)
        if at in self.detachable:
            self.cached[h] = (*group[:at], DETACHED, *group[at + 1 :])
            self.block_hash[b] = None
            self.detached_blocks += 1
            return
        if self.on_evict is not None and DETACHED not in group:
            self.on_evict(h, group)
        del self.cached[h]
        for other in group:
            if other != DETACHED:
                self.block_hash[other] = None
        self.evicted_groups += 1
        if self.events is not None:
            self.events.removed([h])

    def incref(self, blocks: Iterable[int]) -> None:
        """Add an owner to each block; a zero-ref cached block leaves the free queue."""
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def decref(self, blocks: Iterable[int]) -> None:
        """Drop an owner from each block; blocks reaching zero go to the free queue's tail."""
        freed = []
        for b in blocks:
            r = self.ref[b]
            if r <= 0:
                raise RuntimeError(f"block {b} freed more often than it was held")
            self.ref[b] = r - 1
            if r == 1:
                self.free[b] = None
                freed.append(b)
        if freed and self.on_free is not None:
            self.on_free(freed)

    # -- prefix cache ---------------------------------------------------------------------
    def lookup(self, h: BlockHash) -> tuple[int, ...] | None:
        """The group cached under `h` (`DETACHED` where a block left it), or None."""
        return self.cached.get(h)

    def register(self, h: BlockHash, group: tuple[int, ...]) -> bool:
        """Make a full, written group findable under `h`; False if `h` is already cached
        (then the caller's blocks fill the group's `DETACHED` entries, if any).

        Only blocks held by the caller and not yet hashed may be registered (a block belongs
        to at most one cached group).
        """
        old = self.cached.get(h)
        if old is not None:
            if DETACHED in old:  # a sliding lane's block had left: the caller's copy fills in
                fill = [
                    b if o == DETACHED and self.block_hash[b] is None else o
                    for o, b in zip(old, group, strict=True)
                ]
                self.cached[h] = tuple(fill)
                for o, b in zip(old, fill, strict=True):
                    if o == DETACHED and b != DETACHED:
                        self.block_hash[b] = h
            return False
        for b in group:
            if self.ref[b] <= 0 or self.block_hash[b] is not None:
                raise RuntimeError(f"block {b} cannot be registered under a prefix hash")
        self.cached[h] = tuple(group)
        for b in group:
            self.block_hash[b] = h
        return True

    def is_cached(self, b: int) -> bool:
        return self.block_hash[b] is not None

    # -- checks ---------------------------------------------------------------------------
    def check_invariants(self, owners: dict[int, int] | None = None) -> None:
        """Raise AssertionError when a structural invariant is broken.

        `owners`, when given, maps block -> number of holders the caller knows about; each
        reference count must equal it.
        """
        assert len(self.free) + sum(1 for r in self.ref if r > 0) == self.num_blocks
        for b in range(self.num_blocks):
            assert self.ref[b] >= 0
            assert (self.ref[b] == 0) == (b in self.free), f"block {b} in two places"
            if owners is not None:
                assert self.ref[b] == owners.get(b, 0), f"block {b} ref {self.ref[b]}"
        seen: set[int] = set()
        for h, group in self.cached.items():
            for at, b in enumerate(group):
                if b == DETACHED:
                    assert at in self.detachable, f"a required block left a group at {at}"
                    continue
                assert b not in seen, f"block {b} in two cached groups"
                seen.add(b)
                assert self.block_hash[b] == h
        for b, h in enumerate(self.block_hash):
            assert (h is None) == (b not in seen)
