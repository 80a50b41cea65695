"""Lane compaction: where a retention policy's answer becomes free memory in the pool.

A policy answers, per lane (one layer's KV head), the original positions to keep. This
module turns that answer into memory: it maps kept positions to the slots that hold them
(`slots_of`), says which cuts the pool can take now (`compaction_fits`: a lane that holds
shared prefix blocks needs fresh blocks before it can let go of them), and copies the kept
tokens of each lane into fresh blocks, returning the lane's old blocks to the pool
(`compact_lanes`). A compacted lane leaves lockstep and gets an explicit slot map
(`SeqKV.slot_pos`); a shared block is never written, the sequence only drops its reference.

This is separate from the rest of `KVCacheManager` (prefix lookup, allocation, commit, free)
because it is the one place that rewrites a sequence's lanes after they were written; the
manager's `compact_lanes` and friends call these functions with its pool and allocator.
"""

from __future__ import annotations

from typing import Any

import torch

from ctxlab.kv.allocator import BlockAllocator
from ctxlab.kv.seq_kv import SeqKV
from ctxlab.kv.store import KVStore


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


def compaction_fits(
    seq: SeqKV, alloc: BlockAllocator, lanes: list[int], keep: list[torch.Tensor]
) -> list[int]:
    """Indices (into `lanes`) of the cuts the pool can take now.

    A cut copies the kept tokens into fresh blocks after freeing the lane's old ones; an
    old block another sequence shares (a prefix block) is not freed, so a lane holding
    shared blocks needs blocks the pool may not have. Lanes that hold only their own
    blocks always fit (they keep no more blocks than they free); the others are taken in
    order while the free blocks last. A lane left out keeps its tokens for now.
    """
    bs = seq.block_size
    new_nb = [-(-len(k) // bs) for k in keep]
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


def compact_lanes(
    seq: SeqKV,
    pool: KVStore,
    alloc: BlockAllocator,
    lanes: list[int],
    keep: list[torch.Tensor],
    rope: Any = None,
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
    if len(compaction_fits(seq, alloc, lanes, keep)) != len(lanes):
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
