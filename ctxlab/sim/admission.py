"""Admission and release of one request in the simulated pool: prefix lookup block by block,
page and state reservation, tier transfers, commits of computed blocks, release.

`Admission` owns the pool and what admitting needs (page and block sizes, whether prefixes
are reused, when the tier link is next free); the event loop (`Simulator`,
ctxlab/sim/engine.py) owns the queues and asks it to admit, commit and release requests.
"""

from __future__ import annotations

from collections.abc import Mapping

from ctxlab.errors import CtxlabError
from ctxlab.plan.units import fmt_bytes
from ctxlab.sim.config import Setup
from ctxlab.sim.pool import Entry, PagePool
from ctxlab.sim.state import DECODE, PREFILL, Counters, Seq


class Admission:
    """Per-request pool bookkeeping of one simulated instance."""

    def __init__(
        self,
        setup: Setup,
        counters: Counters,
        block_tokens: int,
        prefix_reuse: bool,
        prefill_only: bool,
    ) -> None:
        cfg = setup.config
        self.setup = setup
        self.counters = counters
        self.P = cfg.page_size
        self.B = block_tokens
        self.page_bytes = setup.page_bytes
        self.slot_bytes = setup.cost.state_bytes
        # A recurrent state is not kept at block boundaries, so prefix hits need pure KV.
        self.prefix_reuse = prefix_reuse and self.slot_bytes == 0 and self.page_bytes > 0
        self.prefill_only = prefill_only
        self.pool = PagePool(setup.pool_bytes, self.page_bytes, cfg.offload_bytes)
        self.link_free = 0.0  # when the tier link finishes its queued transfers
        self.admissions = 0

    # -- checks -------------------------------------------------------------------------
    def check_fits(self, seqs: list[Seq]) -> None:
        """Name the first request that could never run, before simulating anything."""
        cap = self.setup.pool_bytes
        if cap is None:
            return
        for s in seqs:
            tokens = s.req.input_len + (1 if self.prefill_only else s.out - 1)
            need = -(-tokens // self.P) * self.page_bytes + self.slot_bytes
            if need > cap:
                where = f" (line {s.req.line})" if s.req.line else ""
                raise CtxlabError(
                    f"request {s.req.index}{where} needs {tokens:,} tokens of cache "
                    f"({fmt_bytes(need)}), more than the whole pool ({fmt_bytes(cap)})"
                )

    # -- admission ----------------------------------------------------------------------
    def _lookup(
        self, s: Seq, reach: Mapping[int, int]
    ) -> tuple[list[tuple[int, Entry | None, int]], int, int, int]:
        """The prompt's cached prefix in order: (key, device entry or None for a tier hit,
        pages in the tier) per block; the prompt pages it covers; pages of unreferenced
        device hits (pinned by admitting); pages to bring back from the tier.

        Committed blocks count, and so do blocks another request completes in the step
        this one is admitted for (`reach`: id of a request -> the token its chunk in this
        step reaches), as the engine's lookup takes them (`KVCacheManager.filled_by_step`).
        A block still being computed beyond that step ends the prefix, and this request
        computes its own copy."""
        found: list[tuple[int, Entry | None, int]] = []
        pages = pinned = from_tier = 0
        if not self.prefix_reuse or s.prefilled:
            return found, 0, 0, 0
        L, B, P = s.req.input_len, self.B, self.P
        per_block = B // P
        entries, tier_map = self.pool.entries, self.pool.tier
        for i, key in enumerate(s.req.hash_ids):
            need = per_block if (i + 1) * B <= L else (L - i * B) // P
            if need == 0:
                break
            entry = entries.get(key)
            if entry is not None:
                if entry.owner is not None and reach.get(id(entry.owner), -1) < (
                    i * B + entry.pages * P
                ):  # not computed by the end of this step: not a hit
                    break
                got = entry.pages
                found.append((key, entry, 0))
                if entry.refs == 0:
                    pinned += got
            elif key in tier_map:
                got = tier_map[key]
                found.append((key, None, got))
                from_tier += got
            else:
                break
            pages += min(got, need)
            if got < need:
                break
        return found, pages, pinned, from_tier

    def try_admit(self, s: Seq, now: float, reach: Mapping[int, int] | None = None) -> bool:
        """Admit `s` if the pool can hold it; False leaves everything unchanged. `reach`:
        how far each request's chunk in this step goes (see `_lookup`)."""
        pool, P, B = self.pool, self.P, self.B
        L = s.req.input_len
        resumed = s.preemptions > 0
        target = L + s.generated if resumed else L
        found, hit_pages, pinned_free, tier_pages = self._lookup(s, reach or {})
        total_pages = -(-target // P)
        # pages not covered by hits are new: private ones or blocks this request will own
        need_bytes = (total_pages - hit_pages + tier_pages) * self.page_bytes + self.slot_bytes
        if need_bytes > pool.available() - pinned_free * self.page_bytes:
            return False
        new_blocks: list[tuple[int, int, int]] = []  # key, pages, token the pages end at
        covered = hit_pages
        if self.prefix_reuse and not s.prefilled:
            for i in range(len(found), len(s.req.hash_ids)):
                key = s.req.hash_ids[i]
                need = B // P if (i + 1) * B <= L else (L - i * B) // P
                if need == 0 or key in pool.entries or key in pool.tier:
                    # cached without its parent, or still being computed by another request:
                    # computed privately (the engine keeps the first copy committed)
                    continue
                new_blocks.append((key, need, i * B + need * P))
                covered += need
        private = total_pages - covered
        for _, e, _ in found:
            if e is not None:
                pool.ref(e)
        for key, e, _ in found:
            if e is None:
                pool.take_from_tier(key)
        ok = pool.reserve(need_bytes)
        assert ok, "admission reserved more than was available"
        s.entries = []
        for key, e, pages in found:
            if e is None:
                e = pool.create(key, pages, None)
            s.entries.append(e)
        s.owned = []
        for key, need, end in new_blocks:
            e = pool.create(key, need, s)
            s.entries.append(e)
            s.owned.append((end, e))
        s.private = private
        s.pages = total_pages
        s.target = target
        self.admissions += 1
        s.admit_seq = self.admissions
        reusable = min(hit_pages * P, ((L - 1) // P) * P)
        if s.prefilled and not resumed:
            s.computed, s.state = L, DECODE
        else:
            s.computed, s.state = reusable, PREFILL
        tier_tokens = 0
        s.ready_at = now
        if tier_pages:
            tier_bytes = tier_pages * self.page_bytes
            cfg = self.setup.config
            link = cfg.offload_latency + tier_bytes / cfg.offload_bandwidth
            s.ready_at = max(now, self.link_free) + link
            self.link_free = s.ready_at
            self.counters.transfer_bytes += tier_bytes
            tier_tokens = min(tier_pages * P, reusable)
        c = self.counters
        if s.reused < 0:  # first admission: these are the headline counts
            s.admitted_at = now
            if s.prefilled:
                s.reused = 0
            else:
                s.reused = reusable
                s.reused_tier = tier_tokens
                c.queried_tokens += L
                c.reused_tokens += reusable
                c.reused_tier_tokens += tier_tokens
                c.computed_tokens += L - reusable
                c.hit_requests += 1 if reusable > 0 else 0
        return True

    def commit(self, s: Seq) -> None:
        """Blocks whose pages `s` has now computed are committed (the engine commits full
        blocks after each step; requests admitted in that step could already take them)."""
        done = 0
        for end, e in s.owned:
            if end > s.computed:
                break
            e.owner = None
            done += 1
        if done:
            del s.owned[:done]

    # -- release ------------------------------------------------------------------------
    def release(self, s: Seq) -> None:
        """Drop the request's hold on the pool; finished blocks stay cached (tail first
        into the LRU queue, so a chain is evicted from its end)."""
        pool = self.pool
        for e in reversed(s.entries):
            pool.unref(e)
        for _, e in s.owned:  # not computed yet: not a valid cache entry
            pool.drop(e)
        pool.release(s.private * self.page_bytes + self.slot_bytes)
        s.entries, s.owned = [], []
        s.private = 0
        s.pages = 0
