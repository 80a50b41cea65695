"""What the engine calls: prefix lookup, slot allocation, commit of full blocks, free.

A logical block is `block_size` token positions across every lane; in lockstep mode it is
backed by a group of `n_lanes` physical blocks. The prefix cache maps a block's chained hash
to that group. Only full blocks are shared, the last prompt token is never taken from the
cache (its logits are needed), and a shared group is never written: new tokens always land
in blocks the sequence allocated itself. Compaction (a retention policy's cut, which
rewrites lanes already written, `compact_lanes`) is the manager's too: it takes blocks from
the same allocator and writes the same pool.

Sliding-window layers (`KVLayout.windows`): after each step `slide` hands back the blocks a
sliding lane's window no longer reads (memory really freed), so such a lane holds at most
`KVLayout.window_blocks` blocks between steps. In the prefix cache a sliding lane's block
may leave its group alone when the pool hands it out again (the group stays findable for
its full-attention lanes); a prefix hit is cut back to the longest prefix whose last
window is still complete in every sliding lane, and a sliding lane takes only that window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_fits_in_memory
from ctxlab.kv.allocator import DETACHED, BlockAllocator
from ctxlab.kv.block_events import BlockEvents
from ctxlab.kv.hashing import BlockHash, hash_blocks
from ctxlab.kv.layout import KVLayout
from ctxlab.kv.pool import KVPool
from ctxlab.kv.quant_pool import QuantKVPool
from ctxlab.kv.seq_kv import HOLE, SeqKV
from ctxlab.kv.store import KVStore


class PrefixExtension(Protocol):
    """What continues a prefix-cache hit past the pool (`kv.prefix_offload.PrefixOffload`
    restores blocks from its tier); the manager knows only this, so the tier's module can
    depend on the manager and not the other way round."""

    def extend(
        self, seq: SeqKV, n_share: int, groups: list[tuple[int, ...]]
    ) -> list[tuple[int, ...]]: ...


@dataclass(frozen=True)
class PrefixHit:
    hashes: list[BlockHash]  # hashes of every full block that may be shared
    groups: list[tuple[int, ...]]  # cached groups found, in order, for the leading blocks
    num_tokens: int  # tokens covered by `groups`


@dataclass(frozen=True)
class KVStats:
    """Pool counters; token counts follow vLLM's prefix_cache_queries / _hits."""

    prefix_cache_queries: int
    prefix_cache_hits: int
    blocks_total: int
    blocks_used: int
    blocks_free: int
    blocks_cached: int  # logical groups findable in the hash map
    cached_blocks_evicted: int  # logical groups dropped from the map when reused
    resident_bytes: int  # bytes of blocks in use, measured from the pool
    pool_bytes: int
    # sliding-lane blocks that left a cached group alone when reused (the group stays)
    cached_blocks_detached: int = 0
    blocks_slid: int = 0  # blocks sliding lanes handed back as their windows moved

    @property
    def hit_rate(self) -> float:
        return (
            self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        )


class KVCacheManager:
    def __init__(
        self,
        layout: KVLayout,
        pool_tokens: int,
        enable_prefix_caching: bool = True,
        device: str | torch.device = "cpu",
        extra: tuple[str, ...] = (),
        kv_format: str | None = None,
        kv_group: int = 32,
    ):
        """`kv_format` None keeps K/V in the layout dtype; "int8", "kivi4" or "kivi2" stores
        them quantized (`QuantKVPool`, KIVI key groups of gcd(kv_group, block_size) tokens)."""
        if pool_tokens < layout.block_size:
            raise CtxlabError(
                f"the KV pool of {pool_tokens} tokens is smaller than one block of "
                f"{layout.block_size} tokens."
            )
        self.layout = layout
        self.block_size = layout.block_size
        self.n_lanes = layout.n_lanes
        n_blocks = layout.blocks_for_tokens(pool_tokens)
        if torch.device(device).type == "cpu":  # a pool that cannot fit: one sentence, not a
            # failed allocation (int8 and KIVI codes are smaller: the full width bounds them)
            width = max(layout.head_dim, layout.head_dim_v)
            need = 2 * n_blocks * layout.block_size * width * layout.dtype_bytes
            check_fits_in_memory(need, f"the KV pool of {pool_tokens:,} tokens")
        self.kv_format = kv_format
        self.pool: KVStore
        if kv_format is None:
            self.pool = KVPool(layout, n_blocks, device)
        else:
            self.pool = QuantKVPool(layout, n_blocks, kv_format, kv_group, device)
        windows = layout.lane_windows()
        # Sliding lanes by window size: [lanes] tensors, for `slide` and prefix hits.
        self.sliding: dict[int, torch.Tensor] = {}
        for w in sorted({w for w in windows if w is not None}):
            lanes = [i for i, x in enumerate(windows) if x == w]
            self.sliding[w] = torch.tensor(lanes, dtype=torch.int64)
        detachable = frozenset(i for i, w in enumerate(windows) if w is not None)
        self.alloc = BlockAllocator(self.pool.num_blocks, detachable)
        self.blocks_slid = 0
        self.alloc.on_free = self._released
        self.enable_prefix_caching = enable_prefix_caching
        self.extra = extra  # model identity folded into every first block
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        # The offload tier, when one is attached (`PrefixOffload` sets itself here).
        self.offload: PrefixExtension | None = None

    @property
    def pool_tokens(self) -> int:
        """Tokens per lane the pool holds."""
        return self.pool.num_blocks // self.n_lanes * self.block_size

    def _released(self, blocks: list[int]) -> None:
        self.pool.release(blocks)

    def new_seq(self) -> SeqKV:
        return SeqKV(self.n_lanes, self.block_size)

    def _extra(self, salt: str | None) -> tuple[str, ...]:
        return (*self.extra, f"salt={salt}" if salt is not None else "nosalt")

    # -- prefix cache ---------------------------------------------------------------------
    def lookup_prefix(
        self,
        seq: SeqKV,
        token_ids: Sequence[int],
        salt: str | None = None,
        compute_tail: int = 1,
        in_flight: Mapping[BlockHash, tuple[int, ...]] | None = None,
    ) -> PrefixHit:
        """Cached groups for the leading full blocks of `token_ids`; with an offload tier
        attached, groups it restores into the pool continue the hit.

        `in_flight` (`filled_by_step` of the sequences already in the step being scheduled)
        are groups this step writes: a hit may take them, because every layer writes the
        whole step's K/V before any of its attention reads (`PagedAttention.attend`), so
        requests that arrive together with one prefix compute it once (vLLM caches blocks
        when it schedules them, to the same effect).

        The blocks holding the last `compute_tail` tokens are never matched: at least one
        token is computed (its logits give the next token), and a retention policy that
        reads the prompt's last W queries gets them computed rather than skipped.
        """
        if not self.enable_prefix_caching:
            return PrefixHit([], [], 0)
        n_share = max(0, len(token_ids) - max(1, compute_tail)) // self.block_size
        self._extend_hashes(seq, token_ids, salt, n_share)
        groups: list[tuple[int, ...]] = []
        for h in seq.block_hashes[:n_share]:
            g = self.alloc.lookup(h)
            if g is None and in_flight:
                g = in_flight.get(h)
            if g is None:
                break
            groups.append(g)
        groups = groups[: self._window_complete(groups)]
        if self.offload is not None:  # the hit goes on with blocks restored from the tier
            n_pool, hashes = len(groups), seq.block_hashes
            absent = []  # blocks not in the map now: a restore stores them (told to `events`)
            if self.alloc.events is not None:
                absent = [b for b in range(n_pool, n_share) if self.alloc.lookup(hashes[b]) is None]
            groups = self.offload.extend(seq, n_share, groups)
            restored = [b for b in absent if b < len(groups)]
            if restored:
                self._tell_stored(seq, token_ids, salt, restored)
        return PrefixHit(seq.block_hashes[:n_share], groups, len(groups) * self.block_size)

    def _window_complete(self, groups: list[tuple[int, ...]]) -> int:
        """Longest leading run of `groups` whose last window is whole in every sliding lane
        (a sliding lane's older blocks may have left their groups)."""
        n = len(groups)
        if not self.sliding or n == 0:
            return n
        for w, lanes in self.sliding.items():
            ls = lanes.tolist()
            gone = [any(g[lane] == DETACHED for lane in ls) for g in groups]
            while n > 0 and any(gone[self.layout.first_kept_block(w, n * self.block_size) : n]):
                n -= 1
        return n

    def _first_kept(self, num_tokens: int) -> torch.Tensor:
        """`[n_lanes]` first block each lane of a `num_tokens`-token sequence still needs
        (0 for full-attention lanes)."""
        first = torch.zeros(self.n_lanes, dtype=torch.int64)
        for w, lanes in self.sliding.items():
            first[lanes] = self.layout.first_kept_block(w, num_tokens)
        return first

    def _hit_blocks(self, hit: PrefixHit) -> tuple[list[int], torch.Tensor]:
        """Blocks a fresh sequence takes from `hit` (a sliding lane only its last window)
        and the first block each lane holds."""
        first = self._first_kept(hit.num_tokens)
        if not self.sliding:
            return [b for g in hit.groups for b in g], first
        f = first.tolist()
        taken = [b for i, g in enumerate(hit.groups) for lane, b in enumerate(g) if i >= f[lane]]
        return taken, first

    def _extend_hashes(
        self, seq: SeqKV, token_ids: Sequence[int], salt: str | None, n_blocks: int
    ) -> None:
        have = len(seq.block_hashes)
        if n_blocks > have:
            parent = seq.block_hashes[-1] if have else None
            end = n_blocks * self.block_size
            seq.block_hashes.extend(
                hash_blocks(token_ids[:end], self.block_size, self._extra(salt), have, parent)
            )

    # -- allocation -----------------------------------------------------------------------
    def can_allocate(self, seq: SeqKV, num_tokens: int, hit: PrefixHit | None = None) -> bool:
        """Whether `seq` (fresh when `hit` is given) can hold `num_tokens` tokens per lane."""
        need, extra_free = self._need(seq, num_tokens, hit)
        return need + extra_free <= self.alloc.num_free

    def _need(self, seq: SeqKV, num_tokens: int, hit: PrefixHit | None) -> tuple[int, int]:
        bs = self.block_size
        want = -(-num_tokens // bs)
        if hit is not None:
            held, _ = self._hit_blocks(hit)
            zero_ref = sum(1 for b in held if self.alloc.ref[b] == 0)
            return (want - len(hit.groups)) * self.n_lanes, zero_ref
        if seq.lockstep:
            return max(0, want - int(seq.n_blocks[0])) * self.n_lanes, 0
        per_lane = (seq.lane_len + num_tokens - seq.num_tokens + bs - 1) // bs - seq.n_blocks
        return int(per_lane.clamp(min=0).sum()), 0

    def allocate(
        self,
        seq: SeqKV,
        num_tokens: int,
        hit: PrefixHit | None = None,
        num_query_tokens: int = 0,
    ) -> bool:
        """Give `seq` room for `num_tokens` tokens per lane; all or nothing.

        With `hit`, `seq` must be empty: it first takes the cached groups (and is counted as a
        prefix-cache query of `num_query_tokens` tokens), then fresh blocks for the rest.
        """
        if not self.can_allocate(seq, num_tokens, hit):
            return False
        if hit is not None:
            if seq.max_blocks:
                raise RuntimeError("a prefix hit can only be applied to an empty sequence")
            self.prefix_cache_queries += num_query_tokens
            self.prefix_cache_hits += hit.num_tokens
            n = len(hit.groups)
            if n:
                taken, first = self._hit_blocks(hit)
                self.alloc.incref(taken)
                seq.ensure_capacity(n)
                seq.table[:, :n] = torch.tensor(hit.groups, dtype=torch.int64).T
                holes = torch.arange(n)[None, :] < first[:, None]
                seq.table[:, :n].masked_fill_(holes, HOLE)
                seq.dropped[:] = first
                seq.n_blocks[:] = n
                seq.lane_len[:] = hit.num_tokens
            seq.num_hit_blocks = n
            seq.num_committed_blocks = n
        self._grow(seq, num_tokens)
        return True

    def _grow(self, seq: SeqKV, num_tokens: int) -> None:
        bs = self.block_size
        if seq.lockstep:
            have = int(seq.n_blocks[0])
            want = -(-num_tokens // bs)
            if want > have:
                ids = self.alloc.allocate((want - have) * self.n_lanes)
                seq.ensure_capacity(want)
                # Lane-major: each lane takes a run of the ids (consecutive ones from a fresh
                # free queue), so a long prompt's lanes are runs of adjacent blocks that decode
                # attention reads in place (`KVPool.run_view`) instead of gathering.
                seq.table[:, have:want] = torch.tensor(ids, dtype=torch.int64).view(
                    self.n_lanes, want - have
                )
                seq.n_blocks[:] = want
            return
        grow_by = num_tokens - seq.num_tokens
        want = (seq.lane_len + grow_by + bs - 1) // bs
        for lane in range(self.n_lanes):
            have, w = int(seq.n_blocks[lane]), int(want[lane])
            if w > have:
                seq.ensure_capacity(w)
                seq.table[lane, have:w] = torch.tensor(self.alloc.allocate(w - have))
                seq.n_blocks[lane] = w

    def slot_rows(self, seq: SeqKV, n_new: int) -> torch.Tensor:
        """Flat pool rows `[n_lanes, n_new]` where the next `n_new` tokens of `seq` go."""
        bs = self.block_size
        idx = seq.lane_len.unsqueeze(1) + torch.arange(n_new).unsqueeze(0)
        blocks = torch.gather(seq.table, 1, idx // bs)
        return blocks * bs + idx % bs

    def advance(self, seq: SeqKV, n_new: int, first_pos: int | None = None) -> None:
        """Record that `n_new` tokens were written to every lane of `seq`.

        `first_pos` is the original position of the first new token; it is only needed once a
        lane was compacted (the slot map is no longer the identity).
        """
        if seq.slot_pos is not None:
            need = int(seq.n_blocks.max()) * self.block_size
            if seq.slot_pos.shape[1] < need:
                grown = torch.full((self.n_lanes, need), -1, dtype=torch.int64)
                grown[:, : seq.slot_pos.shape[1]] = seq.slot_pos
                seq.slot_pos = grown
            start = seq.num_tokens if first_pos is None else first_pos
            idx = seq.lane_len.unsqueeze(1) + torch.arange(n_new).unsqueeze(0)
            pos = torch.arange(start, start + n_new).expand(self.n_lanes, n_new)
            seq.slot_pos.scatter_(1, idx, pos)
        seq.lane_len += n_new

    # -- compaction: where a retention policy's answer becomes free memory ----------------
    # A policy answers, per lane (one layer's KV head), the original positions to keep.
    # These map kept positions to the slots that hold them (`slots_of`), say which cuts the
    # pool can take now (`compaction_fits`: a lane that holds shared prefix blocks needs
    # fresh blocks before it can let go of them), and copy the kept tokens of each lane
    # into fresh blocks, returning the lane's old blocks to the pool (`compact_lanes`). A
    # compacted lane leaves lockstep and gets an explicit slot map (`SeqKV.slot_pos`); a
    # shared block is never written, the sequence only drops its reference.
    @staticmethod
    def lane_positions(seq: SeqKV, lanes: slice | list[int]) -> torch.Tensor:
        """Original positions `[len(lanes), L]` the lanes hold, slot by slot; -1 pads shorter
        lanes (L is the longest of them)."""
        lens = seq.lane_len[lanes]
        n = int(lens.max()) if lens.numel() else 0
        if seq.slot_pos is None:
            pos = torch.arange(n).repeat(len(lens), 1)
        else:
            pos = seq.slot_pos[lanes, :n].clone()
        return pos.masked_fill(torch.arange(n)[None, :] >= lens[:, None], -1)

    @staticmethod
    def slots_of(positions: torch.Tensor, keep: list[torch.Tensor]) -> list[torch.Tensor]:
        """Slot indices of kept original positions, per lane (`positions [n, L]` as given by
        `lane_positions`, real slots sorted); one `searchsorted` for every lane. A kept
        position the lane does not hold is a bug in the policy: RuntimeError."""
        big = torch.iinfo(torch.int64).max
        sorted_pos = positions.masked_fill(positions < 0, big)
        counts = torch.tensor([len(k) for k in keep], device=positions.device)
        k_pad = torch.nn.utils.rnn.pad_sequence(keep, batch_first=True, padding_value=0)
        real = torch.arange(k_pad.shape[1], device=positions.device)[None, :] < counts[:, None]
        k_pad = k_pad.masked_fill(~real, big)  # (a float padding value would not hold int64 max)
        slots = torch.searchsorted(sorted_pos, k_pad)
        width = positions.shape[1]
        found = sorted_pos.gather(1, slots.clamp(max=width - 1))
        if bool(((found != k_pad) & real).any()) or bool(((slots >= width) & real).any()):
            raise RuntimeError("a policy kept a position its lane does not hold")
        return [slots[h, : len(k)] for h, k in enumerate(keep)]

    def compaction_fits(self, seq: SeqKV, lanes: list[int], keep: list[torch.Tensor]) -> list[int]:
        """Indices (into `lanes`) of the cuts the pool can take now.

        A cut copies the kept tokens into fresh blocks after freeing the lane's old ones; an
        old block another sequence shares (a prefix block) is not freed, so a lane holding
        shared blocks needs blocks the pool may not have. Lanes that hold only their own
        blocks always fit (they keep no more blocks than they free); the others are taken in
        order while the free blocks last. A lane left out keeps its tokens for now.
        """
        bs = seq.block_size
        new_nb = [-(-len(k) // bs) for k in keep]
        alloc = self.alloc
        free = alloc.num_free
        if sum(new_nb) <= free:
            return list(range(len(lanes)))
        ref = alloc.ref
        out, shared_need = [], []
        for i, lane in enumerate(lanes):
            old = seq.table[lane, : int(seq.n_blocks[lane])].tolist()
            own = sum(1 for b in old if ref[b] == 1)
            if own == len(old):
                out.append(i)
                free += own - new_nb[i]
            else:
                shared_need.append((i, own))
        for i, own in shared_need:
            if new_nb[i] <= free + own:
                out.append(i)
                free += own - new_nb[i]
        return sorted(out)

    def compact_lane(self, seq: SeqKV, lane: int, keep: torch.Tensor) -> None:
        """`compact_lanes` for one lane."""
        self.compact_lanes(seq, [lane], [keep])

    def compact_lanes(
        self, seq: SeqKV, lanes: list[int], keep: list[torch.Tensor], rope: Any = None
    ) -> None:
        """Keep only slots `keep[i]` (sorted) of lane `lanes[i]`, in fresh blocks; free the rest.

        The kept tokens are copied into blocks the sequence allocates now (a shared prefix block
        is never written, the sequence only drops its reference), the lanes leave lockstep, and
        their old blocks return to the pool for real. Every lane of a call shares one read of
        the kept rows, one `decref`, one `allocate` and one write. With `rope` (an object with
        `shift_keys(k, delta)`), the key moved from slot s to slot j is rotated by j - s
        (cache-slot positions: slot j always holds a key rotated for position j).
        """
        if not lanes:
            return
        pool, alloc = self.pool, self.alloc
        if len(self.compaction_fits(seq, lanes, keep)) != len(lanes):
            raise RuntimeError("the pool lacks the blocks to copy kept tokens out of shared ones")
        bs = seq.block_size
        if seq.slot_pos is None:
            cap = int(seq.n_blocks.max()) * bs
            seq.slot_pos = torch.arange(cap).repeat(seq.n_lanes, 1)
        lane_t = torch.tensor(lanes, dtype=torch.int64)
        counts = torch.tensor([len(k) for k in keep], dtype=torch.int64)
        slots = torch.nn.utils.rnn.pad_sequence(keep, batch_first=True, padding_value=0)
        width = slots.shape[1]
        valid = torch.arange(width)[None, :] < counts[:, None]  # [m, K]
        table = seq.table.index_select(0, lane_t)  # [m, cap]
        old_rows = (table.gather(1, slots // bs) * bs + slots % bs)[valid]
        k, v = pool.read_rows(old_rows)  # copies, read before the old blocks are freed
        pos = seq.slot_pos.index_select(0, lane_t).gather(1, slots)[valid]
        if rope is not None:
            j = torch.arange(width).expand_as(slots)
            delta = (j - slots)[valid]
            if bool((delta != 0).any()):
                k = rope.shift_keys(k[:, None], delta)[:, 0]
        # Free the old blocks (tail first in each lane), then allocate.
        old_nb = seq.n_blocks.index_select(0, lane_t)
        nb_max = int(old_nb.max())
        held = torch.arange(nb_max)[None, :] < old_nb[:, None]
        alloc.decref(table[:, :nb_max].flip(1)[held.flip(1)].tolist())
        new_nb = (counts + bs - 1) // bs
        ids = torch.tensor(alloc.allocate(int(new_nb.sum())), dtype=torch.int64)
        nb_new_max = int(new_nb.max())
        jb = torch.arange(nb_new_max)[None, :]
        own = jb < new_nb[:, None]  # [m, nbn]
        offset = torch.cumsum(new_nb, 0) - new_nb
        idx = (offset[:, None] + jb).clamp(max=max(len(ids) - 1, 0))
        fresh = torch.where(own, ids[idx], table[:, :nb_new_max]) if len(ids) else table[:, :0]
        table[:, : fresh.shape[1]] = fresh
        seq.table[lane_t] = table
        jt = torch.arange(width).expand_as(slots)
        new_rows = (fresh.gather(1, jt // bs) * bs + jt % bs)[valid] if len(ids) else old_rows[:0]
        pool.write_rows(new_rows, k, v)  # a quantized pool quantizes them in their new groups
        sp = torch.full((len(lanes), seq.slot_pos.shape[1]), -1, dtype=torch.int64)
        sp[:, :width][valid] = pos
        seq.slot_pos[lane_t] = sp
        seq.n_blocks[lane_t] = new_nb
        seq.lane_len[lane_t] = counts
        seq.lockstep = False

    def _uncommitted_full(
        self, seq: SeqKV, token_ids: Sequence[int], salt: str | None, num_tokens: int
    ) -> list[tuple[int, BlockHash, tuple[int, ...]]]:
        """(block, hash, group) of each block of `seq` past its committed ones that is full at
        `num_tokens` tokens: what `commit` registers (none without prefix caching or off
        lockstep)."""
        if not (self.enable_prefix_caching and seq.lockstep):
            return []
        n_full = num_tokens // self.block_size
        if n_full <= seq.num_committed_blocks:
            return []
        self._extend_hashes(seq, token_ids, salt, n_full)
        out = []
        for b in range(seq.num_committed_blocks, n_full):
            if bool((seq.dropped > b).any()):  # a sliding lane let go of it (`slide` runs
                break  # after `commit`, so only a sequence that skipped commits gets here)
            out.append((b, seq.block_hashes[b], tuple(seq.table[:, b].tolist())))
        return out

    def commit(self, seq: SeqKV, token_ids: Sequence[int], salt: str | None = None) -> None:
        """Offer every newly full (written) block of `seq` to the prefix cache."""
        stored: list[int] = []  # blocks newly findable, told to `alloc.events` in runs
        for b, h, group in self._uncommitted_full(seq, token_ids, salt, seq.num_tokens):
            if self.alloc.register(h, group):
                stored.append(b)
            seq.num_committed_blocks = b + 1
        if stored and self.alloc.events is not None:
            self._tell_stored(seq, token_ids, salt, stored)

    def filled_by_step(
        self, seq: SeqKV, token_ids: Sequence[int], salt: str | None, num_tokens: int
    ) -> dict[BlockHash, tuple[int, ...]]:
        """The groups `commit` will register once a step has computed `seq` up to
        `num_tokens` (allocated, not yet written): what `lookup_prefix` takes as `in_flight`."""
        return {h: g for _, h, g in self._uncommitted_full(seq, token_ids, salt, num_tokens)}

    def observe(self, events: BlockEvents | None) -> None:
        """Tell `events` every block the prefix cache stores or removes from now on."""
        self.alloc.events = events

    def _tell_stored(
        self, seq: SeqKV, token_ids: Sequence[int], salt: str | None, stored: list[int]
    ) -> None:
        events, bs, hashes = self.alloc.events, self.block_size, seq.block_hashes
        assert events is not None
        runs: list[list[int]] = []
        for b in stored:
            if runs and runs[-1][-1] == b - 1:
                runs[-1].append(b)
            else:
                runs.append([b])
        for run in runs:
            lo, hi = run[0], run[-1] + 1
            parent = hashes[lo - 1] if lo else None
            events.stored(hashes[lo:hi], parent, token_ids[lo * bs : hi * bs], bs, salt)

    def slide(self, seq: SeqKV) -> int:
        """Hand back the blocks each sliding lane of `seq` no longer reads (the next query
        reads a window back from the last token); returns how many were freed."""
        if not self.sliding:
            return 0
        freed: list[int] = []
        for w, lanes in self.sliding.items():
            first = torch.div(  # `KVLayout.first_kept_block`, for every lane at once
                (seq.lane_len[lanes] - w).clamp(min=0), self.block_size, rounding_mode="floor"
            )
            lo = seq.dropped[lanes]
            if not bool((first > lo).any()):
                continue
            for lane, a, b in zip(lanes.tolist(), lo.tolist(), first.tolist(), strict=True):
                if b > a:
                    freed.extend(seq.table[lane, a:b].tolist())
                    seq.table[lane, a:b] = HOLE
                    seq.dropped[lane] = b
        if freed:
            self.alloc.decref(freed)
            self.blocks_slid += len(freed)
        return len(freed)

    def free(self, seq: SeqKV) -> None:
        """Return every block of `seq`; cached ones stay findable until reused."""
        self.alloc.decref(seq.held_blocks())
        hashes = seq.block_hashes
        seq.reset()
        seq.block_hashes = hashes  # still valid for the same tokens (preemption resumes)

    # -- measurements ---------------------------------------------------------------------
    def resident_bytes(self, seq: SeqKV | None = None) -> int:
        """Bytes of blocks held (by `seq`, or by anyone), measured from the pool.

        Blocks in use times the pool's bytes per block (a quantized pool: codes, scales and
        zero points), plus a quantized pool's full-precision rows of partial blocks.
        """
        pool = self.pool
        if seq is None:
            return self.alloc.num_used * pool.block_bytes + pool.residual_bytes()
        held = int(seq.held.sum()) * pool.block_bytes
        return held + pool.residual_bytes(seq.held_blocks())

    def stats(self) -> KVStats:
        return KVStats(
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            blocks_total=self.alloc.num_blocks,
            blocks_used=self.alloc.num_used,
            blocks_free=self.alloc.num_free,
            blocks_cached=self.alloc.num_cached_groups,
            cached_blocks_evicted=self.alloc.evicted_groups,
            resident_bytes=self.resident_bytes(),
            pool_bytes=self.pool.nbytes,
            cached_blocks_detached=self.alloc.detached_blocks,
            blocks_slid=self.blocks_slid,
        )
