"""The prefix cache's second tier: evicted groups spill to `OffloadTier`, hits restore them.

Two hooks, both on `KVCacheManager`: the allocator calls `evicted` when a cached group leaves
the hash map (its blocks are about to be handed out, not yet overwritten), which copies the
group's K/V out and queues the store; `lookup_prefix` calls `extend` with the groups the pool
still holds, which continues the prefix with groups from the tier: it takes fresh blocks,
waits for the restore (behind any queued transfer), writes the bytes in and registers the
groups under their hashes, exactly as if they had been computed. A restore that fails
(missing file, checksum mismatch, I/O error) gives its blocks back and the request computes
those tokens instead: the same tokens either way, only slower.

Counted in vLLM's words where vLLM has them: `external_prefix_cache_queries`/`_hits`
(tokens looked up in / found in the tier), `kv_offload_store_bytes`, `kv_offload_load_bytes`,
`kv_offload_load_time` (seconds a restore took, queue wait included).
Only a float pool of full-attention lanes is offloaded: a quantized pool's codes and a
sliding lane's partial groups are refused at construction.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ctxlab.errors import CtxlabError
from ctxlab.kv.hashing import BlockHash, hash_blocks
from ctxlab.kv.offload_tier import DISK, HOST, KV, OffloadTier, RestoreFailed
from ctxlab.kv.transfer_queue import LOAD, STORE, TransferQueue
from ctxlab.stats import percentile

if TYPE_CHECKING:
    from ctxlab.kv.manager import KVCacheManager
    from ctxlab.kv.seq_kv import SeqKV


@dataclass(frozen=True)
class OffloadStats:
    """What the tier did since the engine started (tokens, bytes, seconds)."""

    external_prefix_cache_queries: int  # tokens looked up in the tier (past a pool hit)
    external_prefix_cache_hits: int  # tokens restored from the tier
    restored_tokens_host: int
    restored_tokens_disk: int
    recomputed_after_failure_tokens: int  # tokens a failed restore left to compute
    kv_offload_store_bytes: int  # pool -> tier
    kv_offload_demote_bytes: int  # host -> disk
    kv_offload_load_bytes: int  # tier -> pool
    kv_offload_load_time: float  # seconds restores took, queue wait included
    stored_blocks: int
    restored_blocks: int
    dropped_blocks: int  # fell off the bottom of the tier
    restore_failures: dict[str, int] = field(default_factory=dict)  # by kind
    load_wait_p50_s: float = float("nan")
    load_wait_p99_s: float = float("nan")
    store_wait_p50_s: float = float("nan")
    store_wait_p99_s: float = float("nan")
    host_blocks: int = 0
    disk_blocks: int = 0
    host_used_bytes: int = 0
    disk_used_bytes: int = 0

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class TransferProfile:
    """A restore's cost as latency + bytes / bandwidth, fitted on this machine: what the
    simulator's `offload_latency` and `offload_bandwidth` take."""

    tier: str  # "host" or "disk"
    latency_s: float
    bandwidth_bytes_per_s: float
    block_bytes: int
    points: tuple[tuple[int, float], ...]  # (blocks restored, median seconds)
    # False: the medians did not grow with the bytes (a busy machine), so latency and
    # bandwidth could not be told apart; the profile is then the largest restore's rate
    # through zero latency, an upper bound on a restore's cost, never an unbounded bandwidth
    resolved: bool = True

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


class PrefixOffload:
    """Glue between a `KVCacheManager` and its `OffloadTier` (see the module docstring)."""

    def __init__(self, kv: KVCacheManager, host_bytes: int, directory: str | None = None):
        if kv.pool.quantized:
            raise CtxlabError(
                "the offload tier keeps float KV blocks; it cannot be combined with a "
                "quantized KV format."
            )
        if kv.sliding:
            raise CtxlabError(
                "the offload tier supports full-attention models only (this model has "
                "sliding-window layers)."
            )
        self.kv = kv
        lay = kv.layout
        bs, n = lay.block_size, kv.n_lanes
        self.tier = OffloadTier(
            ((n, bs, lay.head_dim), (n, bs, lay.head_dim_v)),
            lay.dtype,
            host_bytes,
            directory,
            transfers=TransferQueue(),
        )
        self._slots = torch.arange(bs)
        self.queries = 0
        self.hits = {HOST: 0, DISK: 0}
        self.failed_tokens = 0
        self.failures: dict[str, int] = {"missing": 0, "checksum": 0, "io": 0}
        self.load_time = 0.0
        self.stored_blocks = 0
        self.restored_blocks = 0
        kv.alloc.on_evict = self.evicted
        kv.offload = self

    @property
    def transfers(self) -> TransferQueue:
        return self.tier.transfers

    def hashes_of(self, token_ids: list[int], salt: str | None = None) -> list[BlockHash]:
        """The prefix-cache hashes of the full blocks of `token_ids` (the tier's keys)."""
        return hash_blocks(token_ids, self.kv.block_size, self.kv._extra(salt))

    def _rows(self, group: tuple[int, ...] | list[int]) -> torch.Tensor:
        blocks = torch.tensor(group, dtype=torch.int64)
        return blocks[:, None] * self.kv.block_size + self._slots[None, :]

    # -- store -----------------------------------------------------------------------------
    def evicted(self, h: BlockHash, group: tuple[int, ...]) -> None:
        """A cached group left the hash map: copy it out now (the blocks are reused next)."""
        k, v = self.kv.pool.read_rows(self._rows(group))
        self.tier.put(h, k.to(self.kv.layout.dtype), v.to(self.kv.layout.dtype))
        self.stored_blocks += 1

    # -- restore ---------------------------------------------------------------------------
    def extend(
        self, seq: SeqKV, n_share: int, groups: list[tuple[int, ...]]
    ) -> list[tuple[int, ...]]:
        """`groups` (the pool's leading hit) continued with groups restored from the tier."""
        kv, alloc = self.kv, self.kv.alloc
        hashes = seq.block_hashes[len(groups) : n_share]
        if not hashes:
            return groups
        self.queries += len(hashes) * kv.block_size
        plan: list[tuple[BlockHash, tuple[int, ...] | None]] = []
        for h in hashes:
            g = alloc.lookup(h)
            if g is None and self.tier.where(h) is None:
                break
            plan.append((h, g))
        want = [h for h, g in plan if g is None]
        if not want:
            return groups + [g for _, g in plan if g is not None]
        held = [b for g in groups for b in g] + [b for _, g in plan if g is not None for b in g]
        alloc.incref(held)  # the pool's part of the hit must survive the allocation below
        try:
            n_fit = min(len(want), alloc.num_free // kv.n_lanes)
            if n_fit < len(want):  # room for the leading ones only: cut the plan there
                plan, want = plan[: plan.index((want[n_fit], None))], want[:n_fit]
            if not want:
                return groups + [g for _, g in plan if g is not None]
            # Claim the blocks first (they leave the tier's index now): the allocation below
            # evicts other groups into the tier, which must not push these out of it.
            tiers = [self.tier.where(h) for h in want]
            t0 = time.perf_counter()
            fut = self.tier.load(want)
            fresh = alloc.allocate(len(want) * kv.n_lanes)
            restored = self._restore(want, tiers, fut, fresh, t0)
        finally:
            alloc.decref(held)
        if restored is None:  # failed: compute from the first block the tier should have given
            return groups + [g for _, g in plan[: plan.index((want[0], None))] if g is not None]
        by_hash = dict(zip(want, restored, strict=True))
        return groups + [g if g is not None else by_hash[h] for h, g in plan]

    def _restore(
        self,
        want: list[BlockHash],
        tiers: list[str | None],
        fut: Future[list[KV]],
        fresh: list[int],
        t0: float,
    ) -> list[tuple[int, ...]] | None:
        """Wait for the restore of `want`, write it into `fresh` blocks and register them;
        None when it failed (the blocks go back to the free queue unregistered)."""
        kv, n = self.kv, self.kv.n_lanes
        try:
            blocks = fut.result()
        except RestoreFailed as exc:
            self.failures[exc.kind] += 1
            self.failed_tokens += len(want) * kv.block_size
            kv.alloc.decref(fresh)
            return None
        groups = []
        for i, (h, (k, v)) in enumerate(zip(want, blocks, strict=True)):
            group = tuple(fresh[i * n : (i + 1) * n])
            kv.pool.write_rows(self._rows(group), k, v)
            kv.alloc.register(h, group)
            groups.append(group)
        kv.alloc.decref(fresh)  # zero-ref cached groups now; the caller's allocate takes them
        self.load_time += time.perf_counter() - t0
        for tier in tiers:
            assert tier is not None
            self.hits[tier] += kv.block_size
        self.restored_blocks += len(want)
        return groups

    # -- measurements ----------------------------------------------------------------------
    def measure_profile(
        self, tier: str = HOST, sizes: tuple[int, ...] = (1, 8, 32), repeats: int = 5
    ) -> TransferProfile:
        """Time restores of `sizes` blocks (queue, copy back and the write into the pool, as
        a prefix hit pays them) with scratch blocks and hashes, then fit latency + bytes /
        bandwidth by least squares. Run it on an idle engine; nothing it stores stays."""
        if tier == DISK and self.tier.directory is None:
            raise CtxlabError("a disk transfer profile needs an offload directory.")
        kv, n = self.kv, self.kv.n_lanes
        need = max(sizes) * n
        if kv.alloc.num_free < need:
            raise CtxlabError(f"the pool needs {need} free blocks to measure transfers.")
        blocks = kv.alloc.allocate(need)
        saved = (self.tier.host_bytes, self.tier.store_bytes, dict(self.tier.load_bytes))
        if tier == DISK:
            self.tier.host_bytes = 0  # straight to disk
        else:
            self.tier.host_bytes = max(self.tier.host_bytes, need * self.tier.block_bytes)
        points = []
        try:
            for size in sizes:
                times = []
                for r in range(repeats):
                    hashes = [f"profile/{size}/{r}/{i}".encode() for i in range(size)]
                    for i, h in enumerate(hashes):
                        k, v = kv.pool.read_rows(self._rows(blocks[i * n : (i + 1) * n]))
                        self.tier.put(h, k, v)
                    self.transfers.drain()
                    t0 = time.perf_counter()
                    got = self.tier.load(hashes).result()
                    for i, (k, v) in enumerate(got):
                        kv.pool.write_rows(self._rows(blocks[i * n : (i + 1) * n]), k, v)
                    times.append(time.perf_counter() - t0)
                points.append((size, sorted(times)[len(times) // 2]))
        finally:
            kv.alloc.decref(blocks)
            self.tier.host_bytes, self.tier.store_bytes = saved[0], saved[1]
            self.tier.load_bytes.update(saved[2])
            for d in (LOAD, STORE):  # the profile's transfers are not the engine's
                self.transfers.waits[d].clear()
        xs = [p[0] * self.tier.block_bytes for p in points]
        ys = [p[1] for p in points]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        if slope <= 0:  # time did not grow with bytes: price the largest restore, no latency
            largest = max(range(len(xs)), key=xs.__getitem__)
            rate = xs[largest] / max(ys[largest], 1e-9)
            return TransferProfile(tier, 0.0, rate, self.tier.block_bytes, tuple(points), False)
        latency = max(0.0, my - slope * mx)
        return TransferProfile(tier, latency, 1 / slope, self.tier.block_bytes, tuple(points))

    def stats(self) -> OffloadStats:
        t = self.tier
        lw, sw = self.transfers.waits[LOAD], self.transfers.waits[STORE]
        return OffloadStats(
            external_prefix_cache_queries=self.queries,
            external_prefix_cache_hits=self.hits[HOST] + self.hits[DISK],
            restored_tokens_host=self.hits[HOST],
            restored_tokens_disk=self.hits[DISK],
            recomputed_after_failure_tokens=self.failed_tokens,
            kv_offload_store_bytes=t.store_bytes,
            kv_offload_demote_bytes=t.demote_bytes,
            kv_offload_load_bytes=t.load_bytes[HOST] + t.load_bytes[DISK],
            kv_offload_load_time=self.load_time,
            stored_blocks=self.stored_blocks,
            restored_blocks=self.restored_blocks,
            dropped_blocks=t.dropped_blocks,
            restore_failures=dict(self.failures),
            load_wait_p50_s=percentile(lw, 50),
            load_wait_p99_s=percentile(lw, 99),
            store_wait_p50_s=percentile(sw, 50),
            store_wait_p99_s=percentile(sw, 99),
            host_blocks=len(t.index[HOST]),
            disk_blocks=len(t.index[DISK]),
            host_used_bytes=t.used(HOST),
            disk_used_bytes=t.used(DISK),
        )

    def close(self) -> None:
        self.tier.close()
