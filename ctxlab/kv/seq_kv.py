"""One sequence's cache: a block table per lane and a token count per lane.

Without a retention policy every lane holds the same tokens (lockstep): slot i of every lane
holds token position i, so the slot map is the identity and is not stored. A policy that
keeps different tokens per KV head rewrites a lane's row of `table`, its `lane_len` and its
`slot_pos` row (original positions, kept by the policy) and sets `lockstep = False`; the
attention code already reads per-lane lengths, so nothing else changes.

A sliding-window lane keeps lane index = position but lets go of the blocks its window no
longer reads: `dropped[lane]` leading columns of its `table` row are holes (not held, entry
`HOLE`, a valid block id that attention never unmasks). `n_blocks` still counts the
lane's logical blocks, holes included; `held` counts what it really holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ctxlab.kv.hashing import BlockHash

# Table entry of a block a sliding lane let go of: a real block id (0), so a gather over the
# lane stays in range; the window mask never lets attention read it.
HOLE = 0


@dataclass
class SeqKV:
    n_lanes: int
    block_size: int
    table: torch.Tensor = field(init=False)  # [n_lanes, capacity] int64 physical block ids
    n_blocks: torch.Tensor = field(init=False)  # [n_lanes] blocks held per lane
    lane_len: torch.Tensor = field(init=False)  # [n_lanes] tokens stored per lane
    dropped: torch.Tensor = field(init=False)  # [n_lanes] leading holes (sliding lanes)
    slot_pos: torch.Tensor | None = None  # [n_lanes, capacity * block_size]; None = identity
    lockstep: bool = True
    block_hashes: list[BlockHash] = field(default_factory=list)  # hashes of full blocks
    num_hit_blocks: int = 0  # logical blocks taken from the prefix cache
    num_committed_blocks: int = 0  # logical blocks already offered to the prefix cache

    def __post_init__(self) -> None:
        self.table = torch.zeros(self.n_lanes, 4, dtype=torch.int64)
        self.n_blocks = torch.zeros(self.n_lanes, dtype=torch.int64)
        self.lane_len = torch.zeros(self.n_lanes, dtype=torch.int64)
        self.dropped = torch.zeros(self.n_lanes, dtype=torch.int64)

    @property
    def num_tokens(self) -> int:
        """Tokens stored per lane in lockstep mode (the largest lane otherwise)."""
        return int(self.lane_len.max()) if self.n_lanes else 0

    @property
    def max_blocks(self) -> int:
        return int(self.n_blocks.max()) if self.n_lanes else 0

    def ensure_capacity(self, n_blocks: int) -> None:
        cap = self.table.shape[1]
        if n_blocks > cap:
            new_cap = max(n_blocks, 2 * cap)
            grown = torch.zeros(self.n_lanes, new_cap, dtype=torch.int64)
            grown[:, :cap] = self.table
            self.table = grown

    @property
    def held(self) -> torch.Tensor:
        """`[n_lanes]` blocks each lane really holds (holes not counted)."""
        return self.n_blocks - self.dropped

    def held_blocks(self) -> list[int]:
        """Every physical block this sequence holds, tail blocks first."""
        out: list[int] = []
        if self.lockstep:  # column by column from the tail, every lane's block of a column
            nb = int(self.n_blocks[0]) if self.n_lanes else 0
            cols = self.table[:, :nb].flip(1).T
            if not bool(self.dropped.any()):
                return cols.reshape(-1).tolist()
            held = torch.arange(nb - 1, -1, -1)[:, None] >= self.dropped[None, :]
            return cols[held].tolist()
        else:
            for lane in range(self.n_lanes):
                nb, lo = int(self.n_blocks[lane]), int(self.dropped[lane])
                out.extend(self.table[lane, lo:nb].flip(0).tolist())
        return out

    def reset(self) -> None:
        self.__post_init__()
        self.slot_pos = None
        self.lockstep = True
        self.num_hit_blocks = 0
        self.num_committed_blocks = 0
