"""Reading long lanes in place: runs of adjacent blocks as views into the pool.

Gathering a lane copies its whole KV, per layer and per decode token. Lane-major allocation
(`KVCacheManager`) gives each lane a run of adjacent blocks per allocation (a prompt chunk),
and the lanes of one layer sit at equal distances in the pool, so a run of a layer is one
strided view `[n_kv, n, d]` (`KVPool.run_view`): no copy. `plan_runs` finds, once per step,
each decode row's runs of at least `MIN_RUN_BLOCKS` full blocks and, per layer, the view of
each; the other blocks (decode-time blocks, fragments, the partial last one) are gathered
into one small piece. `attend_pieces` attends over the pieces as one softmax.

Only dense rows (every lane holds the same `length` tokens, no mask) of at least
`IN_PLACE_MIN_TOKENS` are planned: below it the gather is cheap and one batched SDPA call
over every row wins. Only a pool with views (`KVStore.views`) is read this way: a
quantized pool's run is a decoded copy, no cheaper than the gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ctxlab.kv.store import KVStore

# Measured by benchmarks/decode_in_place.py (the crossover against gathering): on a
# shared 2-core CPU, 0.92-0.95x at 4K tokens, 1.24x at 16K.
IN_PLACE_MIN_TOKENS = 8192
MIN_RUN_BLOCKS = 8
# CPU flash attention that also returns each row's log-sum-exp (to merge pieces exactly).
_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass
class RowRuns:
    """One decode row of one layer: views `(first block, blocks, head stride)` and the
    block ids `[n_kv, m]` of the rest, whose first `rest_len` slots are keys."""

    views: list[tuple[int, int, int]]
    rest: torch.Tensor | None
    rest_len: int


def plan_runs(
    table: torch.Tensor,
    length: int,
    n_layers: int,
    n_kv: int,
    block_size: int,
    skip: frozenset[int] = frozenset(),
) -> list[list[RowRuns]] | None:
    """Per layer, per row of `table [B, n_lanes, nb]` (lanes of all layers, every one
    holding `length` tokens): how to read it in place; None when some row has no long run.
    Layers in `skip` (sliding-window layers, which read only their window) are not
    planned (their entries are empty) and do not break the runs of the others."""
    if length < IN_PLACE_MIN_TOKENS or len(skip) >= n_layers:
        return None
    n_full, partial = divmod(length, block_size)
    tf = table[:, :, :n_full]
    lanes_read = [
        layer * n_kv + h for layer in range(n_layers) if layer not in skip for h in range(n_kv)
    ]
    tr = tf[:, lanes_read] if skip else tf
    adjacent = ((tr[..., 1:] - tr[..., :-1]) == 1).all(1)  # [B, n_full - 1], every lane
    heads = torch.arange(n_kv)[None, :, None]
    out: list[list[RowRuns]] = [[] for _ in range(n_layers)]
    for b in range(table.shape[0]):
        starts = [0, *(torch.nonzero(~adjacent[b])[:, 0] + 1).tolist()]
        ends = [*starts[1:], n_full]
        long = [e - s >= MIN_RUN_BLOCKS for s, e in zip(starts, ends, strict=True)]
        if not any(long):
            return None
        first = tf[b][:, starts].view(n_layers, n_kv, -1)  # first block of each run
        stride = first[:, 1] - first[:, 0] if n_kv > 1 else torch.zeros_like(first[:, 0])
        spaced = ((first == first[:, :1] + heads * stride[:, None]).all(1) & (stride >= 0)).tolist()
        bases, strides = first[:, 0].tolist(), stride.tolist()
        for layer in range(n_layers):
            if layer in skip:
                out[layer].append(RowRuns([], None, 0))
                continue
            views, rest = [], []
            for r, (s, e) in enumerate(zip(starts, ends, strict=True)):
                if long[r] and spaced[layer][r]:
                    views.append((bases[layer][r], e - s, strides[layer][r]))
                else:
                    rest.extend(range(s, e))
            if partial:
                rest.append(n_full)
            lanes = table[b, layer * n_kv : (layer + 1) * n_kv]
            ids = lanes[:, rest] if rest else None
            rest_len = (len(rest) - (1 if partial else 0)) * block_size + partial
            out[layer].append(RowRuns(views, ids, rest_len))
    return out


def read_pieces(pool: KVStore, runs: RowRuns) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The row's keys and values as pieces `[n_kv, n, d]`: views, then the gathered rest."""
    n_kv = pool.layout.n_kv_heads
    pieces = [pool.run_view(first, n, n_kv, stride) for first, n, stride in runs.views]
    if runs.rest is not None:
        k, v = pool.gather(runs.rest)
        pieces.append((k[:, : runs.rest_len], v[:, : runs.rest_len]))
    return pieces


def attend_pieces(q: torch.Tensor, pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """`q [n_kv, g, d]` over keys split in pieces, as one softmax.

    One piece is one SDPA call (bit for bit what the gathered lane gives). Several: on a
    CPU each piece is one flash-attention call that also returns its log-sum-exp, and the
    outputs are merged by their softmax weights; elsewhere the pieces' logits share one
    explicit softmax."""
    qb = q[None]
    if len(pieces) == 1:
        k, v = pieces[0]
        return F.scaled_dot_product_attention(qb.to(k.dtype), k[None], v[None])[0]
    if q.device.type == "cpu":
        outs, lses = [], []
        for k, v in pieces:
            o, lse = _FLASH_CPU(qb.to(k.dtype), k[None], v[None])
            outs.append(o[0])
            lses.append(lse[0])
        total = torch.logsumexp(torch.stack(lses), dim=0)
        merged = outs[0] * (lses[0] - total).exp()[..., None].to(outs[0].dtype)
        for o, lse in zip(outs[1:], lses[1:], strict=True):
            merged += o * (lse - total).exp()[..., None].to(o.dtype)
        return merged
    scale = q.shape[-1] ** -0.5
    logits = torch.cat([torch.matmul(q.to(k.dtype), k.transpose(-1, -2)) for k, _ in pieces], -1)
    p = torch.softmax(logits.float() * scale, dim=-1)
    out = None
    at = 0
    for k, v in pieces:
        n = k.shape[1]
        part = torch.matmul(p[..., at : at + n].to(v.dtype), v)
        out = part if out is None else out + part
        at += n
    assert out is not None
    return out
