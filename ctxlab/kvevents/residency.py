"""Measured residency: what a KV-event stream says the prefix cache held, and when.

Fed batches in order, `Residency` keeps the blocks resident now and, bounded by
`max_records`, the timeline of resident blocks, each removed block's lifetime, the
evictions in order, and reuse gaps (a block removed, then stored again with the same hash:
the time its content was out of the cache and had to be recomputed). A block is known by
its content as well as its hash: its tokens chained through its parent, without the salt,
so `explain` can say why a request missed: shorter than one block, another salt (the same
tokens are cached under another tenant's salt), evicted at time t, or never stored.

Capacity follows from removals: vLLM and ctxlab remove a cached block only when the pool
hands its memory to another block, so a removal says the pool was full, and the most blocks
cached at once is the pool when a fill left every block cached (a fill of sequential
prompts of whole pages does; a block still being written is in use but not yet stored, so
a long request that evicts before its own blocks are stored makes it a lower bound). The
first removal of a block stored while listening, and the blocks resident at that moment, are
`first_eviction`.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from ctxlab.kvevents.events import AllBlocksCleared, BlockId, BlockRemoved, BlockStored, EventBatch

Content = bytes  # a salt-free chained digest of a block's tokens


def _content(parent: Content | None, tokens: Sequence[int]) -> Content:
    h = hashlib.blake2b(digest_size=12)
    h.update(parent or b"root")
    h.update(",".join(map(str, tokens)).encode())
    return h.digest()


def hash_text(h: BlockId | None) -> str | None:
    """A block hash for JSON: an int in hex, bytes in hex."""
    if h is None:
        return None
    return f"{h:016x}" if isinstance(h, int) else h.hex()


@dataclass
class _Block:
    stored_at: float
    content: Content | None
    salt: str | None
    block_size: int


@dataclass(frozen=True)
class Eviction:
    at: float
    block: str
    lifetime_s: float | None  # None: stored before the stream was read
    resident_before: int  # blocks resident just before it


@dataclass(frozen=True)
class FirstEviction:
    """The first removal: the pool was full."""

    at: float
    resident_blocks: int
    block_size: int

    @property
    def tokens(self) -> int:
        return self.resident_blocks * self.block_size


@dataclass(frozen=True)
class Request:
    """A request to explain: when it was sent (the publisher's clock), its prompt tokens."""

    at: float
    token_ids: tuple[int, ...]
    salt: str | None = None


@dataclass(frozen=True)
class MissReason:
    at: float
    prompt_tokens: int
    hit_blocks: int  # leading full blocks resident when it was sent
    shareable_blocks: int  # full blocks it could have taken (the last token is computed)
    reason: str  # "hit", "shorter than one block", "another salt", "evicted", "never stored"
    evicted_at: float | None = None


@dataclass
class Residency:
    max_records: int = 100_000
    resident: dict[BlockId, _Block] = field(default_factory=dict)
    timeline: deque[tuple[float, int]] = field(init=False)
    evictions: deque[Eviction] = field(init=False)
    lifetimes: deque[float] = field(init=False)
    reuse_gaps: deque[float] = field(init=False)
    first: FirstEviction | None = None
    stored_total: int = 0
    removed_total: int = 0
    removed_unknown: int = 0  # removals of blocks stored before the stream was read
    cleared: int = 0
    block_size: int = 0
    peak_resident: int = 0
    # content -> [(salt, stored_at, removed_at | None)], bounded like the records
    _history: dict[Content, list[tuple[str | None, float, float | None]]] = field(
        default_factory=dict
    )
    _removed_at: dict[BlockId, float] = field(default_factory=dict)
    _content_of: dict[BlockId, tuple[Content, str | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.max_records
        self.timeline = deque(maxlen=n)
        self.evictions = deque(maxlen=n)
        self.lifetimes = deque(maxlen=n)
        self.reuse_gaps = deque(maxlen=n)

    def feed(self, batch: EventBatch) -> None:
        t = batch.ts
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._stored(t, ev)
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    self._removed(t, h)
            elif isinstance(ev, AllBlocksCleared):
                self.cleared += 1
                for h in list(self.resident):
                    self._removed(t, h, eviction=False)
        self.timeline.append((t, len(self.resident)))
        self._bound()

    def feed_all(self, batches: Iterable[EventBatch]) -> Residency:
        for b in batches:
            self.feed(b)
        return self

    def _stored(self, t: float, ev: BlockStored) -> None:
        bs = ev.block_size or 1
        self.block_size = self.block_size or ev.block_size
        parent = ev.parent
        known = self._content_of.get(parent) if parent is not None else None
        content: Content | None = known[0] if known else None
        salt = known[1] if known else ev.salt()
        for i, h in enumerate(ev.block_hashes):
            tokens = ev.token_ids[i * bs : (i + 1) * bs]
            if parent is None or content is not None:
                content = _content(content, tokens)
            gone = self._removed_at.pop(h, None)
            if gone is not None:
                self.reuse_gaps.append(t - gone)
            fresh = h not in self.resident
            self.stored_total += fresh
            if fresh:
                self.resident[h] = _Block(t, content, salt, bs)
            if fresh and content is not None:
                self._content_of[h] = (content, salt)
                hist = self._history.setdefault(content, [])
                hist.append((salt, t, None))
            parent = h
        self.peak_resident = max(self.peak_resident, len(self.resident))

    def _removed(self, t: float, h: BlockId, eviction: bool = True) -> None:
        block = self.resident.pop(h, None)
        before = len(self.resident) + 1
        if block is None:
            self.removed_unknown += 1
            before -= 1
        if eviction and self.first is None and block is not None:
            # a removal of a block stored before the stream was read also says the pool was
            # full, but the resident count then misses every block stored before listening
            # (it read 0 blocks): the first removal of a block seen stored is the figure
            self.first = FirstEviction(t, before, self.block_size)
        self.removed_total += 1
        lifetime = None if block is None else t - block.stored_at
        if lifetime is not None:
            self.lifetimes.append(lifetime)
        if eviction:
            self.evictions.append(Eviction(t, hash_text(h) or "", lifetime, before))
        self._removed_at[h] = t
        if block is not None and block.content is not None:
            hist = self._history.get(block.content, [])
            for i in range(len(hist) - 1, -1, -1):
                if hist[i][0] == block.salt and hist[i][2] is None:
                    hist[i] = (hist[i][0], hist[i][1], t)
                    break

    def _bound(self) -> None:
        """Forget the oldest history once it outgrows `max_records` (dicts keep order)."""
        for d in (self._history, self._removed_at, self._content_of):
            while len(d) > self.max_records:
                d.pop(next(iter(d)))

    # -- reading ------------------------------------------------------------------------
    def explain(self, req: Request) -> MissReason:
        """Why `req` hit or missed, from what was resident when it was sent."""
        bs = self.block_size
        n = len(req.token_ids)
        share = (n - 1) // bs if bs else 0
        if share == 0:
            return MissReason(req.at, n, 0, 0, "shorter than one block")
        content: Content | None = None
        for i in range(share):
            content = _content(content, req.token_ids[i * bs : (i + 1) * bs])
            hist = self._history.get(content, [])
            ours = [(s, a, r) for s, a, r in hist if s == req.salt]
            if any(a <= req.at and (r is None or r > req.at) for _, a, r in ours):
                continue
            gone = [r for _, a, r in ours if a <= req.at and r is not None and r <= req.at]
            if gone:
                return MissReason(req.at, n, i, share, "evicted", max(gone))
            if any(s != req.salt and a <= req.at for s, a, _ in hist):
                return MissReason(req.at, n, i, share, "another salt")
            return MissReason(req.at, n, i, share, "never stored")
        return MissReason(req.at, n, share, share, "hit")

    def summary(self) -> dict[str, object]:
        life = sorted(self.lifetimes)
        gaps = sorted(self.reuse_gaps)
        return {
            "block_size": self.block_size,
            "resident_blocks": len(self.resident),
            "peak_resident_blocks": self.peak_resident,
            "stored_blocks": self.stored_total,
            "removed_blocks": self.removed_total,
            "removed_unknown_blocks": self.removed_unknown,
            "evictions": len(self.evictions),
            "cleared": self.cleared,
            "median_lifetime_s": _median(life),
            "reuse_gaps": len(gaps),
            "median_reuse_gap_s": _median(gaps),
            "first_eviction": None if self.first is None else asdict(self.first),
            # the most tokens cached at once, once the pool had to remove one: the pool's
            # size when a fill left every block cached, a lower bound otherwise
            "capacity_tokens": None if self.first is None else self.peak_resident * self.block_size,
        }

    def to_json(self) -> dict[str, object]:
        return {
            "summary": self.summary(),
            "timeline": [{"t": t, "resident_blocks": n} for t, n in self.timeline],
            "evictions": [asdict(e) for e in self.evictions],
            "lifetimes_s": list(self.lifetimes),
            "reuse_gaps_s": list(self.reuse_gaps),
        }


def _median(xs: Sequence[float]) -> float | None:
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def first_eviction(batches: Iterable[EventBatch]) -> FirstEviction | None:
    """The pool's capacity confirmed from events: resident blocks at the first removal (for
    the probe's capacity fill and the workshop's eviction demonstration)."""
    return Residency().feed_all(batches).first


def count_evictions(batches: Iterable[EventBatch], start: float, end: float) -> int:
    """Blocks removed (not cleared) between `start` and `end` on the publisher's clock."""
    r = Residency().feed_all(batches)
    return sum(1 for e in r.evictions if start <= e.at <= end)
