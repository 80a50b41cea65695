"""The engine's one decode attention function, and how it reads the pool.

`decode_attention` takes decode queries, block tables, masks, optional extra K/V rows and
returns the output and optionally the probabilities; plain decode, per-layer-width decode,
H2O's scores, Quest's page reads and recall's far rows all call it. Long lanes are read in
place (`lane_runs.py`); the rest is gathered. `attend` is its dense core (also what
`ctxlab.hf` uses over a transformers cache).

`decode_attention` is where a decode kernel plugs in: it takes the queries, the pool (any
`KVStore`) and the block tables with their mask or length, and nothing else of the engine
reaches the pool's reads during decode (`PagedAttention._decode` calls it once per read).
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
    d]` with their mask `[B, n_kv, E]` to the same softmax (recall's far blocks). Returns
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
            else torch.ones_like(em[..., :1]).expand(*em.shape[:2], n_own)
        )
        mask = torch.cat((own, em), 2).unsqueeze(2)
    if not want_probs and softcap is None:
        o = F.scaled_dot_product_attention(q.to(kk.dtype), kk, vv, attn_mask=mask, scale=scale)
        return o, None
    d = q.shape[-1]
    logits = torch.matmul(q, kk.transpose(-1, -2)).float() * (d**-0.5 if scale is None else scale)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if mask is not None:
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
    """Attention of decode queries over paged lanes: THE decode attention of the engine.

    q `[B, n_kv, g, d]` (the g query heads of each KV head as rows); `table [B, n_kv, nb]`
    block ids; `mask [B, n_kv, 1, L]` which of the first L slots are keys (None: the first
    `length` slots, or every slot); `extra` and `want_probs` as in `attend`. With `runs`
    (one `RowRuns` per row, from `plan_runs`: lanes that all hold `length` tokens in long
    runs of adjacent blocks) the lanes are read in place from the pool; otherwise they are
    gathered into `[B, n_kv, L, d]` first.
    """
    # -- kernel hook (issue 25): the compiled paged decode reads the pool in place; None when
    # it does not serve this call (no numba, not CPU, KIVI pool, CTXLAB_DECODE_KERNEL=torch).
    if extra is None and not want_probs:
        o = paged_decode(q, pool, table, mask, length)
        if o is not None:
            return o, None
    # -- end of the kernel hook; below, the torch reference and fallback.
    if runs is not None:
        outs = [attend_pieces(q[b], read_pieces(pool, r)) for b, r in enumerate(runs)]
        return torch.stack(outs), None
    kk, vv = pool.gather(table)  # [B, n_kv, nb * bs, d]
    width = mask.shape[-1] if mask is not None else length
    if width is not None and width < kk.shape[2]:
        kk, vv = kk[:, :, :width], vv[:, :, :width]
    return attend(q, kk, vv, mask, extra, want_probs)
