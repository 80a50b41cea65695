"""The device KV pool as the simulator sees it: integer bytes, prefix entries, LRU, a host tier.

Cached prefixes are kept per trace hash block: one `Entry` holds the pool pages of one
block (block_tokens / page_size pages, fewer for a partial last block). Running requests
reference entries; an entry with no references stays findable in an LRU queue until space
is needed, then it is evicted: dropped, or moved to the host tier when there is one. The
unit of eviction is a whole block, the granularity at which the trace knows identity.

An entry is created when the request that will compute it is admitted (its bytes are
reserved then) and is committed (`owner` None) once that computation has finished, as in
the engine, whose prefix cache registers a block after the step that wrote it. Before that,
only a request admitted for the step that finishes it takes it (`Admission._lookup`); one
admitted while its computation goes on past that step computes its own copy.

Invariants (checked by `check`): used bytes = entry pages x page bytes + private pages and
state slots of running requests; an entry is in the LRU queue exactly when it has no
references; the tier never holds more than its capacity.
"""

from __future__ import annotations

from collections import OrderedDict


class Entry:
    """A cached block: its pages, reference count, and the request still computing it
    (`owner`; None once computed: committed, and only then a prefix-cache hit)."""

    __slots__ = ("key", "owner", "pages", "refs")

    def __init__(self, key: int, pages: int, owner: object | None) -> None:
        self.key = key
        self.pages = pages
        self.refs = 0
        self.owner = owner  # not None while the owner's prefill has not computed it yet


class PagePool:
    """Bytes of the device pool (None = unlimited) and of the optional host tier."""

    def __init__(self, capacity: int | None, page_bytes: int, tier_capacity: int = 0) -> None:
        self.capacity = capacity
        self.page_bytes = page_bytes
        self.used = 0  # entries + private pages + state slots, in bytes
        self.entries: dict[int, Entry] = {}
        self.lru: OrderedDict[int, Entry] = OrderedDict()
        self.evictable = 0  # bytes of entries in the LRU queue
        self.tier_capacity = tier_capacity
        self.tier: OrderedDict[int, int] = OrderedDict()  # key -> pages
        self.tier_used = 0
        self.evicted_blocks = 0
        self.evicted_pages = 0
        self.tier_dropped_blocks = 0

    # -- space --------------------------------------------------------------------------
    def available(self) -> float:
        """Bytes that could be handed out now (free plus evictable)."""
        if self.capacity is None:
            return float("inf")
        return self.capacity - self.used + self.evictable

    def reserve(self, nbytes: int) -> bool:
        """Take `nbytes`, evicting least-recently-used cached blocks as needed."""
        if self.capacity is not None:
            while self.capacity - self.used < nbytes:
                if not self.lru:
                    return False
                self._evict_one()
        self.used += nbytes
        return True

    def release(self, nbytes: int) -> None:
        self.used -= nbytes

    def _evict_one(self) -> None:
        key, entry = self.lru.popitem(last=False)
        del self.entries[key]
        nbytes = entry.pages * self.page_bytes
        self.evictable -= nbytes
        self.used -= nbytes
        self.evicted_blocks += 1
        self.evicted_pages += entry.pages
        if self.tier_capacity >= nbytes > 0:
            while self.tier_capacity - self.tier_used < nbytes:
                _, pages = self.tier.popitem(last=False)
                self.tier_used -= pages * self.page_bytes
                self.tier_dropped_blocks += 1
            self.tier[key] = entry.pages
            self.tier_used += nbytes

    # -- entries ------------------------------------------------------------------------
    def ref(self, entry: Entry) -> None:
        if entry.refs == 0 and entry.key in self.lru:
            del self.lru[entry.key]
            self.evictable -= entry.pages * self.page_bytes
        entry.refs += 1

    def unref(self, entry: Entry) -> None:
        entry.refs -= 1
        if entry.refs == 0:
            self.lru[entry.key] = entry
            self.evictable += entry.pages * self.page_bytes

    def create(self, key: int, pages: int, owner: object | None) -> Entry:
        """Register a block whose bytes the caller has already reserved; referenced once."""
        entry = Entry(key, pages, owner)
        entry.refs = 1
        self.entries[key] = entry
        return entry

    def drop(self, entry: Entry) -> None:
        """Forget an entry that was never computed (its owner was preempted)."""
        assert entry.refs == 0, "an uncomputed block is referenced by another request"
        del self.lru[entry.key]
        del self.entries[entry.key]
        nbytes = entry.pages * self.page_bytes
        self.evictable -= nbytes
        self.used -= nbytes

    def take_from_tier(self, key: int) -> int:
        """Remove a block from the tier (it is coming back to the device); its pages."""
        pages = self.tier.pop(key)
        self.tier_used -= pages * self.page_bytes
        return pages

    def cached_bytes(self) -> int:
        return self.evictable

    def check(self, running_private_bytes: int) -> None:
        """Assert the invariants; tests call this after every step."""
        entry_bytes = sum(e.pages for e in self.entries.values()) * self.page_bytes
        assert self.used == entry_bytes + running_private_bytes, (self.used, entry_bytes)
        assert all((e.refs == 0) == (k in self.lru) for k, e in self.entries.items())
        assert self.evictable == sum(e.pages for e in self.lru.values()) * self.page_bytes
        assert self.tier_used == sum(self.tier.values()) * self.page_bytes
        assert self.tier_used <= self.tier_capacity
        if self.capacity is not None:
            assert self.used <= self.capacity
