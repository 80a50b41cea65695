"""Batched lane compaction: what `KVCacheManager.compact_lane` does, for many lanes at once.

A policy cut touches every lane of a sequence (90 on SmolLM2) once per block of decode
tokens. Doing it lane by lane costs ~20 small tensor ops and two allocator round trips per
lane; here all lanes of one sequence share one gather of the kept K/V rows, one `decref`,
one `allocate` and one scatter. The contract is the manager's: kept tokens are copied into
blocks the sequence allocates now (a shared prefix block is never written, the sequence only
drops its reference), the lane leaves lockstep, and its old blocks return to the pool.
Cache-slot positions (StreamingLLM) re-rotate each kept key to its new slot in the same pass.

This lives with the policies because the engine's manager exposes only the one-lane call;
`KVCacheManager.compact_lanes(seq, lanes, slots)` would be the natural engine hook for it.
"""

from __future__ import annotations

from typing import Any

import torch

from ctxlab.kv.manager import KVCacheManager
from ctxlab.kv.seq_kv import SeqKV


def keep_to_slots_batched(positions: torch.Tensor, keep: list[torch.Tensor]) -> list[torch.Tensor]:
    """Slot indices of the kept positions of each lane (`positions [n, L]`, -1 padding).

    The batched form of `base.keep_to_slots`: one `searchsorted` for all lanes.
    """
    big = torch.iinfo(torch.int64).max
    sorted_pos = positions.masked_fill(positions < 0, big)
    counts = [len(k) for k in keep]
    k_pad = torch.nn.utils.rnn.pad_sequence(keep, batch_first=True, padding_value=0)
    real = torch.arange(k_pad.shape[1])[None, :] < torch.tensor(counts)[:, None]
    k_pad = k_pad.masked_fill(~real, big)  # (a float padding value would not hold int64 max)
    slots = torch.searchsorted(sorted_pos, k_pad)
    width = positions.shape[1]
    found = sorted_pos.gather(1, slots.clamp(max=width - 1))
    if bool(((found != k_pad) & real).any()) or bool(((slots >= width) & real).any()):
        raise RuntimeError("a policy kept a position its lane does not hold")
    return [slots[h, : counts[h]] for h in range(len(keep))]


def compact_lanes(
    kv: KVCacheManager,
    seq: SeqKV,
    lanes: list[int],
    keep: list[torch.Tensor],
    rope: Any = None,
) -> None:
    """Keep only slots `keep[i]` (sorted) of lane `lanes[i]`, in fresh blocks; free the rest.

    With `rope`, the key moved from slot s to slot j is rotated by j - s (cache-slot
    positions: slot j always holds a key rotated for position j).
    """
    if not lanes:
        return
    bs = kv.block_size
    pool, alloc = kv.pool, kv.alloc
    if seq.slot_pos is None:
        cap = int(seq.n_blocks.max()) * bs
        seq.slot_pos = torch.arange(cap).repeat(kv.n_lanes, 1)
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
    # Free the old blocks (tail first in each lane, as the manager does), then allocate.
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
    idx = (offset[:, None] + jb).clamp(max=len(ids) - 1)
    fresh = torch.where(own, ids[idx], table[:, :nb_new_max])
    table[:, :nb_new_max] = fresh
    seq.table[lane_t] = table
    jt = torch.arange(width).expand_as(slots)
    new_rows = (fresh.gather(1, jt // bs) * bs + jt % bs)[valid]
    pool.write_rows(new_rows, k, v)  # a quantized pool quantizes them in their new groups
    sp = torch.full((len(lanes), seq.slot_pos.shape[1]), -1, dtype=torch.int64)
    sp[:, :width][valid] = pos
    seq.slot_pos[lane_t] = sp
    seq.n_blocks[lane_t] = new_nb
    seq.lane_len[lane_t] = counts
    seq.lockstep = False


def move_rows(values: torch.Tensor, lanes: list[int], keep: list[torch.Tensor]) -> None:
    """Per-slot values `[n_lanes, capacity]` (H2O's scores) follow a compaction in place:
    row `lanes[i]` takes its entries at slots `keep[i]`; slots past them start from zero."""
    lane_t = torch.tensor(lanes, dtype=torch.int64)
    slots = torch.nn.utils.rnn.pad_sequence(keep, batch_first=True, padding_value=0)
    counts = torch.tensor([len(k) for k in keep])
    valid = torch.arange(slots.shape[1])[None, :] < counts[:, None]
    rows = values.index_select(0, lane_t)
    moved = torch.zeros_like(rows)
    moved[:, : slots.shape[1]] = rows.gather(1, slots) * valid
    values[lane_t] = moved
