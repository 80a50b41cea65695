"""The paged attention backend: the model's `attend` over the head-granular pool.

Per step the runner fills a `StepPlan`; per layer `attend` (1) writes the new K/V into the
pool rows planned for them, then (2) computes attention with torch SDPA:
- decode tokens (1 new token per sequence) are batched: each sequence's lanes of this layer
  are gathered from the pool into `[B, Hkv, L, d]` with a length mask per (sequence, lane);
  the query heads sharing a KV head ride as extra query rows, so K/V are never repeated;
- a prefill chunk with nothing cached before it attends causally to its own K/V directly;
- a prefill chunk after a cached prefix (prefix hit, or an earlier chunk) gathers the lane
  contents (prefix + chunk) from the pool and uses a causal mask offset by the prefix length.
Per-lane lengths are honoured everywhere, so lanes compacted by a retention policy work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ctxlab.kv.pool import KVPool


@dataclass
class PrefillItem:
    start: int  # first index of this sequence's tokens in the flat batch
    end: int
    fresh: bool  # nothing of this sequence was in the cache before this chunk
    table: torch.Tensor | None = None  # [n_lanes, nb]
    prev_len: torch.Tensor | None = None  # [n_lanes] tokens before the chunk
    first_pos: int = 0


@dataclass
class StepPlan:
    rows: torch.Tensor  # [n_layers, T, Hkv] pool rows of the new tokens
    decode_idx: torch.Tensor | None = None  # [Bd] flat indices of decode tokens
    decode_table: torch.Tensor | None = None  # [Bd, n_lanes, nb]
    decode_mask: torch.Tensor | None = None  # [Bd, n_lanes, 1, L] bool
    prefills: list[PrefillItem] = field(default_factory=list)


class PagedAttention:
    def __init__(self, pool: KVPool, n_heads: int, sliding_windows: tuple[int | None, ...] = ()):
        self.pool = pool
        self.layout = pool.layout
        self.n_heads = n_heads
        self.n_kv = self.layout.n_kv_heads
        self.group = n_heads // self.n_kv
        self.windows = sliding_windows
        self.plan: StepPlan | None = None

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        plan = self.plan
        assert plan is not None, "the runner sets a StepPlan before each forward"
        if self.windows and self.windows[layer_idx] is not None:
            raise NotImplementedError("sliding-window layers are not supported by the engine yet")
        self.pool.write(plan.rows[layer_idx], k, v)
        T = q.shape[0]
        out = q.new_empty(T, self.n_heads, v.shape[-1])
        lanes = self.layout.lanes_of_layer(layer_idx)
        if plan.decode_idx is not None:
            out[plan.decode_idx] = self._decode(q[plan.decode_idx], plan, lanes)
        for item in plan.prefills:
            s, e = item.start, item.end
            if item.fresh:
                out[s:e] = self._fresh(q[s:e], k[s:e], v[s:e])
            else:
                out[s:e] = self._chunk(q[s:e], item, lanes)
        return out

    def _decode(self, q: torch.Tensor, plan: StepPlan, lanes: slice) -> torch.Tensor:
        B = q.shape[0]
        kk, vv = self.pool.gather(plan.decode_table[:, lanes])  # [B, Hkv, L, d]
        qg = q.view(B, self.n_kv, self.group, -1)
        o = F.scaled_dot_product_attention(qg, kk, vv, attn_mask=plan.decode_mask[:, lanes])
        return o.reshape(B, self.n_heads, -1)

    def _fresh(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0),
            is_causal=True,
            enable_gqa=True,
        )
        return o[0].transpose(0, 1)

    def _chunk(self, q: torch.Tensor, item: PrefillItem, lanes: slice) -> torch.Tensor:
        n = q.shape[0]
        kk, vv = self.pool.gather(item.table[lanes])  # [Hkv, L, d]
        L = kk.shape[1]
        prev = item.prev_len[lanes].view(self.n_kv, 1, 1, 1)
        limit = prev + torch.arange(1, n + 1).view(1, 1, n, 1)
        mask = torch.arange(L).view(1, 1, 1, L) < limit  # [Hkv, 1, n, L]
        mask = mask.expand(self.n_kv, self.group, n, L).reshape(1, self.n_kv, self.group * n, L)
        qg = q.view(n, self.n_kv, self.group, -1).permute(1, 2, 0, 3)
        qg = qg.reshape(1, self.n_kv, self.group * n, -1)
        o = F.scaled_dot_product_attention(qg, kk.unsqueeze(0), vv.unsqueeze(0), attn_mask=mask)
        o = o.view(self.n_kv, self.group, n, -1).permute(2, 0, 1, 3)
        return o.reshape(n, self.n_heads, -1)
