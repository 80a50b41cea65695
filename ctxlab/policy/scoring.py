"""What the driver sees inside the attention backend: queries, and decode attention scores.

- `QueryLog`: the last `w` queries of every layer of one sequence, a ring buffer written once
  per step for all layers (SnapKV's observation window, TOVA's current query, H2O's seed).
- `PolicyAttention`: the engine's backend with the driver looking over its shoulder. For a
  policy that accumulates attention every decode step (H2O), the decode attention of a layer
  is computed here for the whole batch at once with an explicit softmax, and those very
  probabilities are the scores: one gather of the cache serves both the output and the
  score, where scoring separately would read every lane a second time. With per-layer
  budgets (PyramidKV) each layer's decode rows read only as many blocks as its own lanes
  use (`trimmed_decode`), not the width of the longest layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F


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


class WithoutDecode:
    """Runs the inner backend on the step's plan without its decode rows: it still writes
    every new K/V and attends for prefill chunks, and the caller computes the decode rows
    itself. The stripped plan is built once per step, not per layer."""

    def __init__(self) -> None:
        self._src: Any = None
        self._stripped: Any = None

    def __call__(
        self, inner: Any, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        plan = inner.plan
        if self._src is not plan:
            self._src = plan
            self._stripped = dataclasses.replace(plan, decode_idx=None)
        inner.plan = self._stripped
        try:
            return inner.attend(layer, q, k, v)
        finally:
            inner.plan = plan


def scored_decode(
    inner: Any,
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rest: WithoutDecode,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backend's output with decode rows computed here; returns (out, probs `[B, n_kv, L]`).

    The probabilities are summed over the query heads of each KV head's group (H2O's
    per-KV-head score); masked slots get 0.
    """
    plan = inner.plan
    out = rest(inner, layer, q, k, v)
    lay = inner.pool.layout
    lanes = lay.lanes_of_layer(layer)
    kk, vv = inner.pool.gather(plan.decode_table[:, lanes])  # [B, n_kv, L, d]
    mask = plan.decode_mask[:, lanes]  # [B, n_kv, 1, L]
    qd = q.index_select(0, plan.decode_idx)
    B, H, d = qd.shape
    n_kv = kk.shape[1]
    qg = qd.view(B, n_kv, H // n_kv, d)
    logits = torch.matmul(qg, kk.transpose(-1, -2)).float() * d**-0.5
    p = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    o = torch.matmul(p.to(vv.dtype), vv)  # [B, n_kv, g, dv]
    out.index_copy_(0, plan.decode_idx, o.reshape(B, H, -1).to(out.dtype))
    return out, p.sum(2)


def trimmed_decode(
    inner: Any, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rest: WithoutDecode
) -> torch.Tensor:
    """The backend's output with decode rows read over this layer's own longest lane.

    The step's decode table is as wide as the longest lane of any layer; with per-layer
    budgets (PyramidKV) the bottom layers keep several times what the top ones keep, and
    every layer would gather (and mask) the bottom layers' width. Here each layer gathers
    only the blocks its own lanes use.
    """
    plan = inner.plan
    out = rest(inner, layer, q, k, v)
    lay = inner.pool.layout
    lanes = lay.lanes_of_layer(layer)
    mask = plan.decode_mask[:, lanes]  # [B, n_kv, 1, L]
    n = int(mask.sum(-1).max())
    nb = -(-n // lay.block_size)
    kk, vv = inner.pool.gather(plan.decode_table[:, lanes, :nb])  # [B, n_kv, nb * bs, d]
    qd = q.index_select(0, plan.decode_idx)
    B, H, d = qd.shape
    qg = qd.view(B, kk.shape[1], H // kk.shape[1], d)
    o = F.scaled_dot_product_attention(qg, kk, vv, attn_mask=mask[..., : nb * lay.block_size])
    out.index_copy_(0, plan.decode_idx, o.reshape(B, H, -1).to(out.dtype))
    return out


class PolicyAttention:
    """The engine's attention backend with the driver looking over its shoulder."""

    def __init__(self, inner: Any, driver: Any):
        self.inner = inner
        self.driver = driver
        self._rest = WithoutDecode()

    @property
    def plan(self) -> Any:
        return self.inner.plan

    @plan.setter
    def plan(self, value: Any) -> None:
        self.inner.plan = value

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        drv = self.driver
        if drv.obs_window:
            drv.record_queries(layer_idx, q)
        sel = drv.selector
        if sel is not None:
            return sel.attend(self.inner, layer_idx, q, k, v)
        plan = self.inner.plan
        if plan.decode_idx is None or not (drv.scores_in_attention or drv.uneven_layers):
            return self.inner.attend(layer_idx, q, k, v)
        if not drv.scores_in_attention:
            return trimmed_decode(self.inner, layer_idx, q, k, v, self._rest)
        out, probs = scored_decode(self.inner, layer_idx, q, k, v, self._rest)
        drv.step_probs[layer_idx] = probs
        return out
