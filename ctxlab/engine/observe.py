"""What the policy runtime keeps per sequence to build what a policy sees.

- `QueryLog`: the last `w` queries of every layer of one sequence, a ring buffer written
  once per step for all layers (SnapKV's observation window, TOVA's current query, H2O's
  seed), from the rows attention kept for it (`PolicyReads.keep_queries` in the `StepPlan`).
- `SeqState`: a sequence's prompt length, decode step, cache-slot shift, query log, H2O's
  accumulated attention per slot (`acc`, moved with compaction by `move_rows`) and lane
  budgets.
- `lane_keys`: one layer's keys gathered from the pool, for the observation builder
  (`ctxlab.policy.observation.observe_layer`, which asks for them only when a need reads
  them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ctxlab.kv.manager import KVCacheManager
from ctxlab.kv.seq_kv import SeqKV


class QueryLog:
    """The last `w` queries `[n_layers, H, w, d]` of one sequence and their positions."""

    def __init__(self, n_layers: int, n_heads: int, w: int, d: int):
        self.w = w
        self.q = torch.zeros(n_layers, n_heads, w, d)
        self.pos = torch.full((w,), -1, dtype=torch.int64)
        self.written = 0

    def append(self, q: torch.Tensor, first_pos: int) -> None:
        """Add `q [n_layers, n, H, d]` (consecutive tokens from position `first_pos`)."""
        n = q.shape[1]
        if n > self.w:
            q, first_pos, n = q[:, -self.w :], first_pos + n - self.w, self.w
        if n == 1:
            i = self.written % self.w
            self.q[:, :, i] = q[:, 0]
            self.pos[i] = first_pos
        else:
            idx = (self.written + torch.arange(n)) % self.w
            self.q[:, :, idx] = q.transpose(1, 2).float()
            self.pos[idx] = torch.arange(first_pos, first_pos + n)
        self.written += n

    def ordered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries `[n_layers, H, m, d]`, positions `[m]`), oldest first, m <= w."""
        m = min(self.written, self.w)
        idx = (self.written - m + torch.arange(m)) % self.w
        return self.q[:, :, idx], self.pos[idx]


@dataclass
class SeqState:
    prompt_len: int
    prefilled: bool = False
    step: int = 0
    pos_shift: int = 0
    next_start: int = 0  # where the next step must start; anything else means a restart
    log: QueryLog | None = None  # the last `query_window` queries of every layer
    acc: torch.Tensor | None = None  # [n_lanes, capacity] accumulated attention per slot
    budgets: torch.Tensor | None = field(default=None, repr=False)  # [n_lanes] tokens

    def acc_rows(self, n_lanes: int, n: int) -> torch.Tensor:
        """The score rows `[n_lanes, capacity >= n]`, grown with zeros."""
        acc = self.acc
        if acc is None or acc.shape[1] < n:
            cap = -(-(n + 64) // 64) * 64
            grown = torch.zeros(n_lanes, cap)
            if acc is not None:
                grown[:, : acc.shape[1]] = acc
            self.acc = acc = grown
        return acc


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


def lane_keys(kv: KVCacheManager, seq: SeqKV, layer: int, n: int) -> torch.Tensor:
    """Keys `[n_kv, n, d]` of one layer's lanes, slot by slot (padding past each lane)."""
    lay = kv.layout
    lanes = lay.lanes_of_layer(layer)
    k, _ = kv.pool.gather(seq.table[lanes, : -(-n // lay.block_size)])
    return k[:, :n]
