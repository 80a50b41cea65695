"""The paged attention backend: the model's `attend` over the head-granular pool.

Per step the runner hands attention a `StepPlan` (`begin_step`): plain data built before
the forward, the one thing it reads (as nano-vllm's `Context`). Per layer `attend` (1)
writes the new K/V into the pool rows planned for them, then (2) computes attention:
- decode tokens (1 new token per sequence): one call per `DecodeRead` the plan holds for
  the layer, on the path the read names ("kernel": the compiled paged kernel, chosen once
  per step; "in-place" or "gather": `torch_decode`). The query heads sharing a KV head ride
  as extra query rows, so K/V are never repeated;
- a prefill chunk with nothing cached before it attends causally to its own K/V directly;
- a prefill chunk after a cached prefix (prefix hit, or an earlier chunk) attends over the
  lane contents (prefix + chunk) with a causal mask offset by the prefix length: in bf16 on
  AMX tiles reading the pool's blocks in place where `kernels/chunk_attention` takes the
  pool, else gathered from the pool into SDPA.
Per-lane lengths are honoured everywhere, so lanes compacted by a retention policy work.
A policy that applies a sparse pattern in prefill (`PolicyReads.prefill_mask`: Longformer,
BigBird) has its `[n, L]` mask ANDed into the prefill masks of full-attention layers, built
once per prefill item and step; its lanes are uncut until the prompt ends, so lane index =
position.
A sliding-window layer (Mistral, Gemma local layers) adds `key > query - W` to each of these
masks and reads only the blocks its window covers. Its lanes keep lane index = position, but
the blocks behind the window are handed back to the pool after each step
(`KVCacheManager.slide`): their table entries become holes that the window mask never
unmasks. No policy compacts a sliding lane.

What a policy asked for is in the plan (`StepPlan.policy`): rows whose queries to keep,
decode probabilities (H2O's scores), the keys written (Quest's block summaries), and reads
marked for the page reader (Quest) or the far reader (recall), the two choices that need
the layer's query; those readers are given once, when the backend is built. Attention never
writes the plan or a policy's state: what it observed goes into the step's `StepReadback`,
which `end_step` returns for the runtime.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from ctxlab.engine.compiled_decode import CompiledDecode
from ctxlab.engine.decode_attention import torch_decode
from ctxlab.engine.decode_reads import own_width
from ctxlab.engine.kernels import chunk_attention
from ctxlab.engine.kernels.paged_decode import run_kernel
from ctxlab.engine.step_plan import (
    DecodeRead,
    ExtraReader,
    PageReader,
    PrefillItem,
    StepPlan,
    StepReadback,
)
from ctxlab.kv.store import KVStore


class PagedAttention:
    def __init__(
        self,
        pool: KVStore,
        n_heads: int,
        sliding_windows: tuple[int | None, ...] = (),
        pages: PageReader | None = None,
        far: ExtraReader | None = None,
        prefill_dtype: torch.dtype | None = None,
    ):
        """`prefill_dtype`: the dtype prefill attention computes in (None: the queries'); the
        reduced weight formats ask for bfloat16 where the CPU multiplies it natively
        (`weights.convert_weights`), and the output comes back in the queries' dtype."""
        self.pool = pool
        self.prefill_dtype = prefill_dtype
        self.layout = pool.layout
        self.n_heads = n_heads
        self.n_kv = self.layout.n_kv_heads
        self.group = n_heads // self.n_kv
        self.windows = sliding_windows
        self.pages = pages  # a page policy's reader (Quest), for reads marked `pages`
        self.far = far  # recall's far reader, for reads marked `far`
        self.plan: StepPlan | None = None
        self._readback = StepReadback.empty(self.layout.n_layers)
        self._chunk_masks: dict[int, torch.Tensor] = {}  # per prefill item (start), this step
        self._chunk_biases: dict[int, torch.Tensor] = {}  # the same masks as additive -inf
        self._chunk_spans: dict[tuple[int, int | None, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._policy_masks: dict[int, torch.Tensor] = {}  # the policy's pattern, likewise
        # a pure decode step's attention described for the model's compiled decode block (a
        # page reader narrows every read itself: its steps keep `attend`)
        self._compiled = CompiledDecode.for_pool(pool, n_heads) if pages is None else None
        # chunks after a cached prefix on tiles, reading the pool in place (bf16 prefill only)
        self._chunk_tiles = prefill_dtype == torch.bfloat16 and chunk_attention.takes(pool)

    def begin_step(self, plan: StepPlan) -> None:
        """Read `plan` for this step's forward."""
        self.plan = plan
        self._readback = StepReadback.empty(self.layout.n_layers)
        self._chunk_masks, self._chunk_biases, self._policy_masks = {}, {}, {}
        self._chunk_spans = {}
        if self._compiled is not None and self.far is None:
            self._compiled.prepare(plan, plan.rows.shape[1])

    def end_step(self) -> StepReadback:
        """What this step's forward observed, for the policy runtime; forgets the plan."""
        self.plan, self._chunk_masks, self._policy_masks = None, {}, {}
        self._chunk_biases, self._chunk_spans = {}, {}
        if self._compiled is not None:
            self._compiled.finish()
        return self._readback

    def compiled_decode(self, layer_idx: int) -> int:
        """`CompiledDecodeBackend`: the address of this layer's attention described for the
        model's compiled decode block this step (it writes the new k/v and attends itself),
        or 0: call `attend`."""
        return 0 if self._compiled is None else self._compiled.address(layer_idx)

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        plan = self.plan
        assert plan is not None, "the runner calls begin_step before each forward"
        self.pool.write(plan.rows[layer_idx], k, v)
        asked = plan.policy
        if asked.keep_queries is not None:
            self._readback.queries[layer_idx] = q.index_select(0, asked.keep_queries)
        if asked.record_keys:
            self._readback.keys[layer_idx] = (plan.rows[layer_idx], k, v)
        T = q.shape[0]
        lanes = self.layout.lanes_of_layer(layer_idx)
        if plan.decode_idx is not None and not plan.prefills and plan.decode_idx.numel() == T:
            return self._decode(q, layer_idx)  # a pure decode step: rows 0..T-1
        out = q.new_empty(T, self.n_heads, v.shape[-1])
        if plan.decode_idx is not None:
            dec = self._decode(q.index_select(0, plan.decode_idx), layer_idx)
            out.index_copy_(0, plan.decode_idx, dec.to(out.dtype))
        # the step's q (and k, v where a prompt attends to itself alone) in the prefill dtype
        # once, not once per sequence; outputs come back in that dtype and are widened as
        # they are copied into `out` (chunks read their k and v back from the pool)
        qp = self._in_prefill_dtype(q)
        kp, vp = k, v
        if any(item.fresh for item in plan.prefills):
            kp, vp = self._in_prefill_dtype(k), self._in_prefill_dtype(v)
        for item in plan.prefills:
            s, e = item.start, item.end
            window = self._window(layer_idx)
            if item.fresh:
                pattern = self._pattern(item, e - s, item.first_pos) if window is None else None
                out[s:e] = self._fresh(qp[s:e], kp[s:e], vp[s:e], window, pattern)
            else:
                out[s:e] = self._chunk(qp[s:e], item, lanes, window)
        return out

    def _pattern(self, item: PrefillItem, width: int, k_first: int = 0) -> torch.Tensor | None:
        """The policy's prefill mask `[n, width]` for `item` over keys at positions
        `k_first..` (lane index = position), or None; built once per item and step (every
        full-attention layer shares it)."""
        assert self.plan is not None
        pattern = self.plan.policy.prefill_mask
        if pattern is None:
            return None
        memo = self._policy_masks.get(item.start)
        if memo is None or memo.shape[-1] != width:
            n = item.end - item.start
            q_pos = torch.arange(item.first_pos, item.first_pos + n)
            memo = pattern(q_pos, torch.arange(k_first, k_first + width), item.prompt_len)
            if memo is None:
                return None
            self._policy_masks[item.start] = memo
        return memo

    def _window(self, layer_idx: int) -> int | None:
        return self.windows[layer_idx] if self.windows else None

    # -- decode ---------------------------------------------------------------------------
    def _decode(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """Attention of one new token per sequence; q is `[B, H, d]` in decode-batch order:
        one call per read the plan holds for the layer, on the path it names."""
        assert self.plan is not None
        B = q.shape[0]
        qg = q.reshape(B, self.n_kv, self.group, -1)
        reads = self.plan.decode[layer]
        if reads[0].pages:
            reads = self._narrowed(reads[0], layer, qg)
        out: torch.Tensor | None = None
        for r in reads:
            qr = qg if r.rows is None else qg.index_select(0, r.rows)
            if r.path == "kernel":
                o, probs = run_kernel(qr, self.pool, r.table, r.mask, r.length), None
            else:
                extra = r.extra  # the page reader's rows (DSA's tokens, NSA's mean rows)
                if r.far:  # recall's far rows for this layer's query
                    assert self.far is not None
                    extra = self.far.rows(layer, q)
                o, probs = torch_decode(
                    qr, self.pool, r.table, r.mask, r.length, extra, r.want_probs, r.runs
                )
            if probs is not None:
                self._readback.probs[layer] = probs
            if r.rows is None:
                return o.reshape(B, self.n_heads, -1)
            if out is None:
                out = o.new_empty(B, *o.shape[1:])
            out.index_copy_(0, r.rows, o)
        assert out is not None
        return out.reshape(B, self.n_heads, -1)

    def _narrowed(self, read: DecodeRead, layer: int, qg: torch.Tensor) -> tuple[DecodeRead, ...]:
        """The page reader's choice for this layer's query: `read` on the chosen pages, or
        the plan's unnarrowed reads when every row may read every page it holds."""
        assert self.plan is not None and self.pages is not None and read.mask is not None
        narrowed = self.pages.narrow(layer, qg, read.table, read.mask)
        if narrowed is None:
            return self.plan.unnarrowed[layer]
        table, mask, extra = narrowed
        if read.own_width:
            table, mask = own_width(table, mask, self.layout.block_size)
        if extra is None:
            return (replace(read, table=table, mask=mask, pages=False),)
        # the compiled kernel takes no extra rows
        return (replace(read, path="gather", table=table, mask=mask, pages=False, extra=extra),)

    # -- prefill --------------------------------------------------------------------------
    def _fresh(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        window: int | None = None,
        pattern: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal attention of one whole prompt within itself: q, k, v and the result in the
        prefill dtype."""
        mask = None
        if (window is not None and window < q.shape[0]) or pattern is not None:
            pos = torch.arange(q.shape[0])
            diff = pos.view(-1, 1) - pos.view(1, -1)  # query - key
            mask = diff >= 0
            if window is not None:
                mask &= diff < window
            if pattern is not None:
                mask &= pattern
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            is_causal=mask is None,
            enable_gqa=True,
        )
        return o[0].transpose(0, 1)

    def _in_prefill_dtype(self, x: torch.Tensor) -> torch.Tensor:
        """x in the prefill dtype."""
        want = self.prefill_dtype
        return x if want is None or x.dtype == want else x.to(want)

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
        memo = self._chunk_masks.get(item.start)
        if window is None and memo is not None and memo.shape[-1] == L:
            return memo
        prev = item.prev_len[lanes].view(self.n_kv, 1, 1, 1)
        limit = prev + torch.arange(1, n + 1).view(1, 1, n, 1)  # query index + 1
        idx = torch.arange(offset, offset + L).view(1, 1, 1, L)
        mask = idx < limit  # [Hkv, 1, n, L]
        if window is not None:
            mask &= idx >= limit - window
        mask = mask.expand(self.n_kv, self.group, n, L).reshape(1, self.n_kv, self.group * n, L)
        if window is None and bool((item.prev_len == item.prev_len[0]).all()):
            self._chunk_masks[item.start] = mask
        return mask

    def _chunk_bias(
        self,
        item: PrefillItem,
        lanes: slice,
        n: int,
        L: int,
        window: int | None,
        offset: int,
        pattern: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """The chunk's mask (`_chunk_mask` and the policy's pattern) as an additive bias in
        `dtype`. SDPA turns a boolean mask into an additive one on every call (two `where`s,
        18 % of a 3 x 64-token step after a 512-token prefix); the step's shared mask is turned
        once."""
        mask = self._chunk_mask(item, lanes, n, L, window, offset)
        if pattern is not None:
            grouped = pattern.view(1, 1, n, L).expand(self.n_kv, self.group, n, L)
            mask = mask & grouped.reshape(1, self.n_kv, self.group * n, L)
        shared = mask is self._chunk_masks.get(item.start)  # the step's memoized mask
        bias = self._chunk_biases.get(item.start) if shared else None
        if bias is None or bias.shape[-1] != L or bias.dtype != dtype:
            bias = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
            if shared:
                self._chunk_biases[item.start] = bias
        return bias

    def _chunk_span(
        self, item: PrefillItem, lanes: slice, n: int, window: int | None, offset: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`_chunk_mask` as spans: the first and one past the last key index (from `offset`)
        each query row `[Hkv, group * n]` sees; memoized for the step when every lane holds
        the same prefix."""
        assert item.prev_len is not None
        key = (item.start, window, offset)
        memo = self._chunk_spans.get(key)
        if memo is not None:
            return memo
        prev = item.prev_len[lanes].view(self.n_kv, 1, 1)
        hi = prev + torch.arange(1 - offset, n + 1 - offset).view(1, 1, n)
        hi = hi.expand(self.n_kv, self.group, n).reshape(self.n_kv, self.group * n)
        lo = hi - window if window is not None else torch.zeros_like(hi)
        span = (lo.to(torch.int32), hi.to(torch.int32))
        if bool((item.prev_len == item.prev_len[0]).all()):
            self._chunk_spans[key] = span
        return span

    def _chunk(
        self, q: torch.Tensor, item: PrefillItem, lanes: slice, window: int | None = None
    ) -> torch.Tensor:
        """A chunk's attention over its cached past and itself (read back from the pool): q
        and the result in the prefill dtype."""
        n = q.shape[0]
        assert item.table is not None and item.prev_len is not None
        table, skip = item.table[lanes], 0
        if window is not None:  # only the blocks the chunk's first query's window reaches
            skip = max(0, int(item.prev_len[lanes].min()) - window + 1) // self.layout.block_size
            table = table[:, skip:]
        L, offset = table.shape[1] * self.layout.block_size, skip * self.layout.block_size
        pattern = self._pattern(item, L) if window is None else None
        qg = q.view(n, self.n_kv, self.group, -1).permute(1, 2, 0, 3)
        qg = qg.reshape(1, self.n_kv, self.group * n, -1)
        o = None
        if self._chunk_tiles:  # q is in the prefill dtype, bf16
            if pattern is None:  # causal (and windowed): each row's keys are one span
                span = self._chunk_span(item, lanes, n, window, offset)
                o = chunk_attention.attend(qg[0], self.pool, table, span=span)
            else:
                bias = self._chunk_bias(item, lanes, n, L, window, offset, pattern, qg.dtype)
                o = chunk_attention.attend(qg[0], self.pool, table, bias=bias)
        if o is None:
            bias = self._chunk_bias(item, lanes, n, L, window, offset, pattern, qg.dtype)
            kk, vv = self.pool.gather(table)  # [Hkv, L, d]
            kv = (self._in_prefill_dtype(kk).unsqueeze(0), self._in_prefill_dtype(vv).unsqueeze(0))
            o = F.scaled_dot_product_attention(qg, *kv, attn_mask=bias)
        o = o.view(self.n_kv, self.group, n, -1).permute(2, 0, 1, 3)
        return o.reshape(n, self.n_heads, -1)
