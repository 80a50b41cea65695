"""The engine's one decode attention function, and how it reads the pool.

Decode attention takes decode queries, block tables, masks, optional extra K/V rows and
returns the output and optionally the probabilities; plain decode, per-layer-width decode,
H2O's scores, Quest's page reads and recall's far rows all go through it. Long lanes are
read in place (`lane_runs.py`); the rest is gathered. `attend` is its dense core (also what
`ctxlab.hf` uses over a transformers cache).

A decode kernel plugs in beside `torch_decode`: it takes the queries, the pool (any
`KVStore`) and the block tables with their mask or length. The engine's attention calls
the one its step plan names for each read (`DecodeRead.path`: "kernel" is
`kernels.paged_decode.run_kernel`, "in-place" and "gather" are `torch_decode`);
`decode_attention` chooses per call, for everything outside the engine's step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ctxlab.engine.kernels.paged_decode import paged_decode
from ctxlab.engine.lane_runs import RowRuns, attend_pieces, read_pieces
from ctxlab.engine.step_plan import ExtraRows
from ctxlab.kv.store import KVStore


def attend(
    q: torch.Tensor,
    kk: torch.Tensor,
    vv: torch.Tensor,
    mask: torch.Tensor | None = None,
    extra: ExtraRows | None = None,
    want_probs: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Decode queries `q [B, n_kv, g, d]` over dense keys and values `[B, n_kv, L, d]`.

    `mask [B, n_kv, 1, L]` marks the keys (None: all); `extra` adds K/V rows `[B, n_kv, E,
    d]` with their mask `[B, n_kv, E]` to the same softmax (recall's far blocks; a float
    mask is an additive logit bias, -inf for a row that does not count: a page reader's
    single tokens and mean-pooled rows). Returns
    the output `[B, n_kv, g, dv]` and, with `want_probs`, the probabilities `[B, n_kv, g, L]`
    over the L keys (extra rows excluded from their denominator: what a lane's tokens
    received among the lane), else None. `scale` defaults to 1/sqrt(d); `softcap` is
    Gemma 2's tanh cap on the logits.
    """
    n_own = kk.shape[2]
    if extra is not None:
        ek, ev, em = extra
        kk = torch.cat((kk, ek.to(kk.dtype)), 2)
        vv = torch.cat((vv, ev.to(vv.dtype)), 2)
        own = (
            mask[:, :, 0]
            if mask is not None
            else torch.ones_like(em[..., :1], dtype=torch.bool).expand(*em.shape[:2], n_own)
        )
        if em.is_floating_point():  # an additive bias: the lane's own keys get 0 or -inf
            own = torch.zeros(own.shape, dtype=em.dtype, device=em.device).masked_fill(
                ~own, float("-inf")
            )
            mask = torch.cat((own, em), 2).unsqueeze(2).to(kk.dtype)
        else:
            mask = torch.cat((own, em), 2).unsqueeze(2)
    if not want_probs and softcap is None:
        o = F.scaled_dot_product_attention(q.to(kk.dtype), kk, vv, attn_mask=mask, scale=scale)
        return o, None
    d = q.shape[-1]
    logits = torch.matmul(q, kk.transpose(-1, -2)).float() * (d**-0.5 if scale is None else scale)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if mask is not None and mask.is_floating_point():
        logits = logits + mask.float()
    elif mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    p = torch.softmax(logits, dim=-1)
    o = torch.matmul(p.to(vv.dtype), vv)
    if not want_probs:
        return o, None
    probs = p if extra is None else torch.softmax(logits[..., :n_own], dim=-1)
    return o, probs


def decode_attention(
    q: torch.Tensor,
    pool: KVStore,
    table: torch.Tensor,
    mask: torch.Tensor | None = None,
    length: int | None = None,
    extra: ExtraRows | None = None,
    want_probs: bool = False,
    runs: list[RowRuns] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of decode queries over paged lanes, for a caller that has not chosen a path
    (tests, benchmarks, tools): the compiled kernel when it serves the call (no extra rows,
    no probabilities), else `torch_decode`. The engine's step does not come here: its plan
    names each read's path once per step (`PagedAttention._decode`).

    q `[B, n_kv, g, d]` (the g query heads of each KV head as rows); `table [B, n_kv, nb]`
    block ids; `mask [B, n_kv, 1, L]` which of the first L slots are keys (None: the first
    `length` slots, or every slot); `extra`, `want_probs` and `runs` as in `torch_decode`.
    """
    if extra is None and not want_probs:
        o = paged_decode(q, pool, table, mask, length)
        if o is not None:
            return o, None
    return torch_decode(q, pool, table, mask, length, extra, want_probs, runs)


def torch_decode(
    q: torch.Tensor,
    pool: KVStore,
    table: torch.Tensor,
    mask: torch.Tensor | None = None,
    length: int | None = None,
    extra: ExtraRows | None = None,
    want_probs: bool = False,
    runs: list[RowRuns] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The torch reference and fallback of decode attention (arguments as `decode_attention`;
    `extra` and `want_probs` as in `attend`). With `runs` (one `RowRuns` per row, from
    `plan_runs`: lanes that all hold `length` tokens in long runs of adjacent blocks) the
    lanes are read in place from the pool; otherwise they are gathered into
    `[B, n_kv, L, d]` first."""
    if runs is not None:
        outs = [attend_pieces(q[b], read_pieces(pool, r)) for b, r in enumerate(runs)]
        return torch.stack(outs), None
    kk, vv = pool.gather(table)  # [B, n_kv, nb * bs, d]
    width = mask.shape[-1] if mask is not None else length
    if width is not None and width < kk.shape[2]:
        kk, vv = kk[:, :, :width], vv[:, :, :width]
    return attend(q, kk, vv, mask, extra, want_probs)
