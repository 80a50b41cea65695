"""The paged attention backend: the model's `attend` over the head-granular pool.

Per step the runner fills a `StepPlan`, the one thing attention reads (as nano-vllm's
`Context`). Per layer `attend` (1) writes the new K/V into the pool rows planned for them,
then (2) computes attention:
- decode tokens (1 new token per sequence) go through `decode_attention`, the one decode
  attention function: a block table per (sequence, lane), a mask, optional extra K/V rows
  and optionally the probabilities. The query heads sharing a KV head ride as extra query
  rows, so K/V are never repeated. Without a policy, sequences of very different lengths
  are split into length buckets (`decode_buckets`) so a short sequence does not attend over
  the padding of the longest one;
- a prefill chunk with nothing cached before it attends causally to its own K/V directly;
- a prefill chunk after a cached prefix (prefix hit, or an earlier chunk) gathers the lane
  contents (prefix + chunk) from the pool and uses a causal mask offset by the prefix length.
Per-lane lengths are honoured everywhere, so lanes compacted by a retention policy work.
A sliding-window layer (Mistral, Gemma local layers) adds `key > query - W` to each of these
masks and reads only the blocks its window covers. Its lanes keep lane index = position, but
the blocks behind the window are handed back to the pool after each step
(`KVCacheManager.slide`): their table entries become holes that the window mask never
unmasks. No policy compacts a sliding lane.

What a policy's runtime adds to the plan (it never wraps attention): rows whose queries it
keeps, whether decode probabilities are wanted (H2O's scores), whether each layer reads
only its own longest lane (PyramidKV), a page reader that narrows each layer's decode table
to chosen pages (Quest) and extra K/V rows per layer (recall's far tier). Attention fills
the plan's `queries` and `probs`; the runtime reads them after the forward.

Everything that does not depend on the layer (buckets, per-layer block ids, masks) is built
once per step, on first use, and cached on the plan.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ctxlab.engine.decode_attention import decode_attention
from ctxlab.engine.lane_runs import plan_runs
from ctxlab.engine.step_plan import DecodeBucket, PrefillItem, StepPlan
from ctxlab.kv.pool import KVPool

# Padding cost model of `decode_buckets`: one more bucket costs, per layer, about as much as
# gathering and attending over this many extra (sequence, block) pairs (a gather, an SDPA
# call and an index copy ~ 100-150 us on a CPU core; one padded block ~ 4-5 us).
BUCKET_OVERHEAD_BLOCKS = 32


def decode_buckets(extents: list[int], overhead: int = BUCKET_OVERHEAD_BLOCKS) -> list[list[int]]:
    """Split decode rows into buckets minimising sum(|bucket| * its longest extent) plus
    `overhead` per bucket (extents in blocks). Exact, by dynamic programming over the rows
    sorted by extent (in a sorted order an optimal partition is contiguous)."""
    order = sorted(range(len(extents)), key=lambda i: extents[i])
    ext = [extents[i] for i in order]
    n = len(ext)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        for j in range(i):  # bucket = sorted rows j..i-1, its longest is ext[i-1]
            c = best[j] + (i - j) * ext[i - 1] + overhead
            if c < best[i]:
                best[i], cut[i] = c, j
    out: list[list[int]] = []
    i = n
    while i > 0:
        out.append(order[cut[i] : i])
        i = cut[i]
    return out[::-1]


def window_read(
    lens: torch.Tensor, window: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """What a sliding layer's decode reads: for lanes of `lens [B, Hkv]` tokens, the block
    columns `[B, Hkv, nw]` its window covers (a column past a lane's end is clamped by the
    caller and masked) and the mask `[B, Hkv, 1, nw * block_size]` of the keys the new token
    (at lane index len - 1) attends: len - window <= index < len."""
    first = torch.div((lens - window).clamp(min=0), block_size, rounding_mode="floor")
    last = torch.div(lens + block_size - 1, block_size, rounding_mode="floor")
    nw = max(1, int((last - first).max()))
    cols = first[..., None] + torch.arange(nw)
    idx = first[..., None] * block_size + torch.arange(nw * block_size)  # lane index
    lens_ = lens[..., None]
    mask = (idx < lens_) & (idx >= lens_ - window)
    return cols, mask.unsqueeze(2)


class PagedAttention:
    def __init__(self, pool: KVPool, n_heads: int, sliding_windows: tuple[int | None, ...] = ()):
        self.pool: Any = pool
        self.layout = pool.layout
        self.n_heads = n_heads
        self.n_kv = self.layout.n_kv_heads
        self.group = n_heads // self.n_kv
        self.windows = sliding_windows
        self._sliding_layers = frozenset(i for i, w in enumerate(sliding_windows) if w is not None)
        self.in_place = True  # long dense lanes read in place (False: gathered, to compare)
        self.plan: StepPlan | None = None

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        plan = self.plan
        assert plan is not None, "the runner sets a StepPlan before each forward"
        self.pool.write(plan.rows[layer_idx], k, v)
        if plan.keep_queries is not None:
            plan.queries[layer_idx] = q.index_select(0, plan.keep_queries)
        if plan.pages is not None:
            plan.pages.record(plan.rows[layer_idx], k)
        T = q.shape[0]
        lanes = self.layout.lanes_of_layer(layer_idx)
        if plan.decode_idx is not None and not plan.prefills and plan.decode_idx.numel() == T:
            return self._decode(q, plan, layer_idx)  # a pure decode step: rows 0..T-1
        out = q.new_empty(T, self.n_heads, v.shape[-1])
        if plan.decode_idx is not None:
            dec = self._decode(q.index_select(0, plan.decode_idx), plan, layer_idx)
            out.index_copy_(0, plan.decode_idx, dec.to(out.dtype))
        for item in plan.prefills:
            s, e = item.start, item.end
            if item.fresh:
                out[s:e] = self._fresh(q[s:e], k[s:e], v[s:e], self._window(layer_idx))
            else:
                out[s:e] = self._chunk(q[s:e], item, lanes, self._window(layer_idx))
        return out

    def _window(self, layer_idx: int) -> int | None:
        return self.windows[layer_idx] if self.windows else None

    # -- decode ---------------------------------------------------------------------------
    def _decode(self, q: torch.Tensor, plan: StepPlan, layer: int) -> torch.Tensor:
        """Attention of one new token per sequence; q is `[B, H, d]` in decode-batch order."""
        if plan.shaped_decode:
            out = self._decode_shaped(q, plan, layer)
            if out is not None:
                return out
        buckets = self._buckets(plan)
        if len(buckets) == 1:
            return self._decode_bucket(q, buckets[0], layer)
        out = None
        for b in buckets:
            assert b.rows is not None
            o = self._decode_bucket(q.index_select(0, b.rows), b, layer)
            if out is None:
                out = o.new_empty(q.shape[0], *o.shape[1:])
            out.index_copy_(0, b.rows, o)
        assert out is not None
        return out

    def _decode_shaped(self, q: torch.Tensor, plan: StepPlan, layer: int) -> torch.Tensor | None:
        """The whole decode batch at once, read as the policy's runtime asked; None when the
        page reader reads everything anyway (then the plain path runs)."""
        assert plan.decode_table is not None and plan.decode_mask is not None
        lanes = self.layout.lanes_of_layer(layer)
        table, mask = plan.decode_table[:, lanes], plan.decode_mask[:, lanes]
        B, H, d = q.shape
        qg = q.view(B, self.n_kv, self.group, d)
        window = self._window(layer)
        if window is not None:  # a policy never acts on a sliding layer: its window only
            if window not in plan._window_reads:
                lens = mask[:, :, 0].sum(-1)  # sliding lanes are dense (never compacted)
                plan._window_reads[window] = window_read(lens, window, self.layout.block_size)
            cols, wmask = plan._window_reads[window]
            table = table.gather(2, cols.clamp(max=table.shape[-1] - 1))
            o, _ = decode_attention(qg, self.pool, table, wmask)
            return o.reshape(B, H, -1)
        if plan.pages is not None:
            narrowed = plan.pages.narrow(layer, qg, table, mask)
            if narrowed is None:
                return None
            table, mask = narrowed
        if plan.own_width:  # this layer's longest lane, not the longest of any layer
            n = int(mask.sum(-1).max())
            nb = -(-n // self.layout.block_size)
            table, mask = table[..., :nb], mask[..., : nb * self.layout.block_size]
        extra = plan.extra.rows(layer, q) if plan.extra is not None else None
        o, probs = decode_attention(
            qg, self.pool, table, mask, extra=extra, want_probs=plan.want_probs
        )
        if probs is not None:
            plan.probs[layer] = probs
        return o.reshape(B, H, -1)

    def _buckets(self, plan: StepPlan) -> list[DecodeBucket]:
        if plan._buckets is not None:
            return plan._buckets
        assert plan.decode_table is not None and plan.decode_mask is not None
        lay, bs = self.layout, self.layout.block_size
        table, mask = plan.decode_table, plan.decode_mask
        B, n_lanes, nb = table.shape
        m = mask[:, :, 0, : nb * bs]  # [B, n_lanes, L]
        used = m.reshape(B, n_lanes, nb, bs).any(-1).any(1)  # [B, nb] blocks any lane reads
        extents = (used * torch.arange(1, nb + 1)).amax(-1).clamp(min=1).tolist()
        lens = m.sum(-1)  # [B, n_lanes] keys per lane (a prefix when lanes are not selected)
        groups = decode_buckets(extents) if B > 1 else [[0]]
        buckets = []
        for g in groups:
            g.sort()
            rows = None if len(groups) == 1 else torch.tensor(g, dtype=torch.int64)
            nbg = max(extents[i] for i in g)
            tg = table[:, :, :nbg] if rows is None else table[rows, :, :nbg]
            mg = m[:, :, : nbg * bs] if rows is None else m[rows, :, : nbg * bs]
            lg = lens if rows is None else lens[rows]
            Bg = len(g)
            # [n_layers, Bg, Hkv, nb] so each layer's ids are one contiguous slice.
            ids = tg.reshape(Bg, lay.n_layers, self.n_kv, nbg).transpose(0, 1).contiguous()
            n0 = int(lg.flatten()[0])
            dense = bool((lg == n0).all()) and bool(mg[..., :n0].all())
            bmask = None
            runs = None
            if dense and self.in_place and not self.pool.quantized:
                runs = plan_runs(tg, n0, lay.n_layers, self.n_kv, bs, self._sliding_layers)
            if not dense:
                bmask = mg.reshape(Bg, lay.n_layers, self.n_kv, 1, nbg * bs).transpose(0, 1)
                bmask = bmask.contiguous()
            buckets.append(
                DecodeBucket(
                    rows=rows,
                    ids=ids.view(lay.n_layers, -1),
                    mask=bmask,
                    n_seqs=Bg,
                    n_blocks=nbg,
                    length=n0 if dense else nbg * bs,
                    lens=lg,
                    runs=runs,
                )
            )
        plan._buckets = buckets
        return buckets

    def _decode_bucket(self, q: torch.Tensor, b: DecodeBucket, layer: int) -> torch.Tensor:
        Bg = b.n_seqs
        table = b.ids[layer].view(Bg, self.n_kv, b.n_blocks)
        qg = q.reshape(Bg, self.n_kv, self.group, -1)
        mask = None if b.mask is None else b.mask[layer]
        window = self._window(layer)
        if window is not None:
            # Sliding lanes all hold the same tokens (no policy compacts them), so one
            # window read serves every sliding layer of this window.
            if window not in b._window_reads:
                assert b.lens is not None
                lens = b.lens[:, self.layout.lanes_of_layer(layer)]
                b._window_reads[window] = window_read(lens, window, self.layout.block_size)
            cols, mask = b._window_reads[window]
            table = table.gather(2, cols.clamp(max=b.n_blocks - 1))
            o, _ = decode_attention(qg, self.pool, table, mask)
            return o.reshape(Bg, self.n_heads, -1)
        runs = b.runs[layer] if b.runs is not None else None
        o, _ = decode_attention(qg, self.pool, table, mask, length=b.length, runs=runs)
        return o.reshape(Bg, self.n_heads, -1)

    # -- prefill --------------------------------------------------------------------------
    def _fresh(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None
    ) -> torch.Tensor:
        mask = None
        if window is not None and window < q.shape[0]:
            pos = torch.arange(q.shape[0])
            diff = pos.view(-1, 1) - pos.view(1, -1)  # query - key
            mask = (diff >= 0) & (diff < window)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            is_causal=mask is None,
            enable_gqa=True,
        )
        return o[0].transpose(0, 1)

    def _chunk_mask(
        self,
        item: PrefillItem,
        lanes: slice,
        n: int,
        L: int,
        window: int | None = None,
        offset: int = 0,
    ) -> torch.Tensor:
        """Causal mask offset by the prefix, `[1, Hkv, group * n, L]` (and, for a sliding-window
        layer, no key `window` or more behind its query; its keys start at lane index
        `offset`); the full-attention mask is built once per step when every lane holds the
        same prefix (no policy), else per layer."""
        assert item.prev_len is not None
        if window is None and item._mask is not None and item._mask.shape[-1] == L:
            return item._mask
        prev = item.prev_len[lanes].view(self.n_kv, 1, 1, 1)
        limit = prev + torch.arange(1, n + 1).view(1, 1, n, 1)  # query index + 1
        idx = torch.arange(offset, offset + L).view(1, 1, 1, L)
        mask = idx < limit  # [Hkv, 1, n, L]
        if window is not None:
            mask &= idx >= limit - window
        mask = mask.expand(self.n_kv, self.group, n, L).reshape(1, self.n_kv, self.group * n, L)
        if window is None and bool((item.prev_len == item.prev_len[0]).all()):
            item._mask = mask
        return mask

    def _chunk(
        self, q: torch.Tensor, item: PrefillItem, lanes: slice, window: int | None = None
    ) -> torch.Tensor:
        n = q.shape[0]
        assert item.table is not None and item.prev_len is not None
        table, skip = item.table[lanes], 0
        if window is not None:  # only the blocks the chunk's first query's window reaches
            skip = max(0, int(item.prev_len[lanes].min()) - window + 1) // self.layout.block_size
            table = table[:, skip:]
        kk, vv = self.pool.gather(table)  # [Hkv, L, d]
        L = kk.shape[1]
        mask = self._chunk_mask(item, lanes, n, L, window, skip * self.layout.block_size)
        qg = q.view(n, self.n_kv, self.group, -1).permute(1, 2, 0, 3)
        qg = qg.reshape(1, self.n_kv, self.group * n, -1)
        o = F.scaled_dot_product_attention(qg, kk.unsqueeze(0), vv.unsqueeze(0), attn_mask=mask)
        o = o.view(self.n_kv, self.group, n, -1).permute(2, 0, 1, 3)
        return o.reshape(n, self.n_heads, -1)
