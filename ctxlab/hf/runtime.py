"""What a `PolicyCache` does around each layer's attention: the same policy, in transformers.

Per layer and forward (`attend`):
- the prompt (the first forward) attends with transformers' own sdpa attention and the
  model's mask; every later forward attends with ctxlab's decode attention core (`attend`,
  the engine's, with the model's scaling and softcap) over the kept tokens, masked by their
  original positions (causal, and the layer's sliding window), with Quest's pages and
  recall's far rows where the policy asks for them, and H2O's probabilities from the same
  call; a sliding-window layer (Gemma 3's local layers) then drops what left its window;
- then the hooks, as in the engine's runtime: the last `query_window` queries are logged;
  at the end of the prompt the policy's prompt-end cut runs (H2O's scores seeded with the
  window's attention); after each decode token H2O's scores grow by the step's attention
  and, once a lane is `decode_trigger(page)` tokens over its budget, the decode cut runs.
A cut is one `LayerObs` per batch row, the policy's answer, and one gather of the rows kept
(evicted ones to the far tier first for recall). Nothing here decides what to keep.
"""

from __future__ import annotations

from functools import partial

import torch

from ctxlab.engine.decode_attention import attend as attend_rows
from ctxlab.engine.far_reads import FarReads
from ctxlab.engine.step_plan import ExtraRows
from ctxlab.errors import CtxlabError
from ctxlab.hf.attention import AttnOptions, sdpa
from ctxlab.hf.cache import PolicyLayer
from ctxlab.kv.layout import KVLayout
from ctxlab.kv.manager import KVCacheManager
from ctxlab.policy.base import Hook, Policy
from ctxlab.policy.observation import LayerObs, PageObs, observe_layer


class HFRuntime:
    def __init__(self, policy: Policy, layout: KVLayout, n_heads: int, page: int):
        if policy.prefill_key(1) is not None:
            raise CtxlabError(
                f"policy {policy.name!r} masks prefill, but here the prompt runs through "
                "transformers' own attention, which takes no policy mask; use the ctxlab "
                "engine, or the policy's decode-only form."
            )
        self.policy = policy
        self.layout = layout
        self.n_layers, self.n_kv = layout.n_layers, layout.n_kv_heads
        self.n_heads = n_heads
        self.page = page
        self.needs = policy.needs
        self.window = policy.query_window()
        self.trigger = policy.decode_trigger(page)
        self.far = FarReads(policy, layout) if "far" in self.needs else None  # type: ignore[arg-type]
        if "pages" in self.needs:
            policy.check_page(page)  # type: ignore[attr-defined]
        self.pages_total = 0  # Quest: pages a dense decode would read, and pages read
        self.pages_read = 0
        self.prompt_len = 0

    @property
    def read_fraction(self) -> float:
        return self.pages_read / self.pages_total if self.pages_total else 1.0

    # -- attention ------------------------------------------------------------------------
    def attend(self, st: PolicyLayer, module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, mask: torch.Tensor | None,
               **kw: object) -> tuple[torch.Tensor, None]:  # fmt: skip
        opts = AttnOptions.of(kw)
        layer = int(module.layer_idx)
        T = q.shape[2]
        probs = None
        if not st.pruned and not st.prefilled and opts.softcap is None:
            out, _ = sdpa(module, q, k, v, mask, **kw)
        else:
            out, probs = self._attend(st, layer, q, k, v, opts)
        self._after(st, layer, q, T, probs)
        if opts.sliding_window:
            self._forget(st, opts.sliding_window)
        return out, None

    def _attend(self, st: PolicyLayer, layer: int, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, opts: AttnOptions
                ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """ctxlab's decode attention core over the kept rows, masked by their positions."""
        B, H, T, d = q.shape
        n_kv, g = k.shape[1], H // k.shape[1]
        key_pos = st.positions[:, :, None, :]  # [B, n_kv, 1, L]
        q_pos = torch.arange(st.seen - T, st.seen, device=q.device)[:, None]  # [T, 1]
        allowed = key_pos <= q_pos  # [B, n_kv, T, L]
        window = opts.sliding_window
        if window is not None:
            allowed &= key_pos > q_pos - window
        decode = T == 1 and st.prefilled
        qg = q.reshape(B, n_kv, g, T, d)
        extra = None
        if decode and "pages" in self.needs:
            slots, extra = self._pages(qg[:, :, :, 0], st)
            allowed &= slots[:, :, None, :]
            if window is not None:  # mean rows of pages behind the window: not read
                extra = None
        mask = allowed[:, :, None].expand(B, n_kv, g, T, -1).reshape(B, n_kv, g * T, -1)
        if decode and self.far is not None:
            self.far.step_rows = [(b, st.step) for b in range(B)]
            extra = self.far.rows(layer, q[:, :, 0])
        want = decode and "acc_attn" in self.needs
        o, probs = attend_rows(qg.reshape(B, n_kv, g * T, d), k, v, mask, extra, want,
                               opts.scaling, opts.softcap)  # fmt: skip
        out = o.reshape(B, n_kv, g, T, -1).reshape(B, H, T, -1).transpose(1, 2)
        return out, probs

    def _pages(self, qd: torch.Tensor, st: PolicyLayer) -> tuple[torch.Tensor, ExtraRows | None]:
        """A page selector's reads at this step: `[B, n_kv, L]` the slots each lane reads
        (whole pages and single tokens) and the extra mean rows of compressed pages (NSA)."""
        keys = st.keys.float()
        B, n_kv, L, d = keys.shape
        p = self.page
        nb = -(-L // p)
        pad = torch.nn.functional.pad(keys, (0, 0, 0, nb * p - L)).view(B, n_kv, nb, p, d)
        real = (torch.arange(nb * p, device=keys.device) < L).view(1, 1, nb, p, 1)
        have = torch.full((B, n_kv), nb, dtype=torch.int64, device=keys.device)
        n_pages = self.policy.pages_per_step(self.prompt_len, p)  # type: ignore[attr-defined]
        per_row = torch.full((B,), n_pages, dtype=torch.int64, device=keys.device)
        self.pages_total += B * n_kv * nb
        if nb <= int(per_row.min()):
            self.pages_read += B * n_kv * nb
            return torch.ones(B, n_kv, L, dtype=torch.bool, device=keys.device), None
        obs = PageObs(qd.float(), None, None, have, per_row, page=p)
        if "page_bounds" in self.needs:
            obs.kmin = pad.masked_fill(~real, float("inf")).amin(3)
            obs.kmax = pad.masked_fill(~real, float("-inf")).amax(3)
        cnt = real.view(1, 1, nb, p).sum(-1).to(keys.dtype).expand(B, n_kv, nb)
        if "page_means" in self.needs:
            obs.kmean = pad.sum(3) / cnt[..., None]
        if "index_keys" in self.needs:
            ik = self.policy.index_keys(keys)  # type: ignore[attr-defined]
            obs.ikeys = torch.nn.functional.pad(ik, (0, 0, 0, nb * p - L))
            obs.lens = torch.full((B, n_kv), L, dtype=torch.int64, device=keys.device)
        choice = self.policy.choose_pages(obs)  # type: ignore[attr-defined]
        self.pages_read += int(choice.ok.sum())
        chosen = torch.zeros(B, n_kv, nb, dtype=torch.bool, device=keys.device)
        chosen.scatter_(-1, choice.pages, choice.ok)
        slots = chosen[..., torch.arange(L, device=keys.device) // p]
        if choice.tokens is not None:
            read = torch.zeros(B, n_kv, nb * p, dtype=torch.bool, device=keys.device)
            read.scatter_(-1, choice.tokens, choice.tokens_ok)
            slots |= read[..., :L]
        if choice.compressed is None:
            return slots, None
        vals = st.values.float()
        vpad = torch.nn.functional.pad(vals, (0, 0, 0, nb * p - L)).view(B, n_kv, nb, p, -1)
        assert obs.kmean is not None
        bias = cnt.log().float().masked_fill(~choice.compressed, float("-inf"))
        return slots, (obs.kmean, vpad.sum(3) / cnt[..., None], bias)

    # -- hooks ----------------------------------------------------------------------------
    def _after(
        self, st: PolicyLayer, layer: int, q: torch.Tensor, T: int, probs: torch.Tensor | None
    ) -> None:
        if self.window:
            self._log(st, q, T)
        if not st.prefilled:
            st.prefilled = True
            self.prompt_len = st.seen
            if self.policy.evicts:
                self._cut(st, layer, self.policy.on_prefill, 0, seed=True)
            return
        st.step += 1
        if probs is not None:  # H2O: this step's attention, summed over each group
            self._acc(st)[..., : probs.shape[-1]] += probs.sum(2).float()
        if self.policy.evicts and self.policy.wants_decode_hook(st.step):
            self._cut(st, layer, self.policy.on_decode, self.trigger)

    def _log(self, st: PolicyLayer, q: torch.Tensor, T: int) -> None:
        w = self.window
        new = q[:, :, -w:].float()
        pos = torch.arange(st.seen - min(T, w), st.seen, device=q.device)
        if st.q_log is not None:
            new = torch.cat((st.q_log, new), 2)[:, :, -w:]
            pos = torch.cat((st.q_pos, pos))[-w:]
        st.q_log, st.q_pos = new, pos

    def _acc(self, st: PolicyLayer) -> torch.Tensor:
        L = st.positions.shape[-1]
        if st.acc is None:
            st.acc = torch.zeros(st.positions.shape, device=st.positions.device)
        elif st.acc.shape[-1] < L:
            st.acc = torch.nn.functional.pad(st.acc, (0, L - st.acc.shape[-1]))
        return st.acc

    def _obs(self, st: PolicyLayer, layer: int, b: int, seed: bool) -> LayerObs:
        """Batch row `b` of the layer, built by the engine's observation builder."""
        q = st.q_log[b] if st.q_log is not None else None
        return observe_layer(
            layer=layer, n_layers=self.n_layers, n_heads=self.n_heads,
            positions=st.positions[b], seq_len=st.seen, prompt_len=self.prompt_len,
            step=st.step, needs=self.needs, keys=partial(_row, st.keys, b), queries=q,
            query_pos=st.q_pos, acc=self._acc(st)[b] if "acc_attn" in self.needs else None,
            seed=seed,
        )  # fmt: skip

    def _cut(
        self, st: PolicyLayer, layer: int, hook: Hook, trigger: int, seed: bool = False
    ) -> None:
        B, n_kv, L = st.positions.shape
        light = LayerObs(
            layer, self.n_layers, self.n_heads, st.positions[0], st.seen, self.prompt_len
        )
        budget = self.policy.lane_budget(light)
        if not seed and budget is not None and budget + trigger >= L:
            return
        slots = []
        for b in range(B):
            kept = hook(self._obs(st, layer, b, seed))
            if kept is None:
                slots.append(None)
                continue
            slots.append(torch.stack(KVCacheManager.slots_of(st.positions[b], kept)))
        if all(s is None for s in slots):
            return
        full = torch.arange(L, device=st.keys.device).expand(n_kv, L)
        idx = torch.stack([full if s is None else s for s in slots])  # [B, n_kv, K]
        if self.far is not None:
            self._to_far(st, layer, idx)
        d_k, d_v = st.keys.shape[-1], st.values.shape[-1]
        st.keys = st.keys.gather(2, idx[..., None].expand(-1, -1, -1, d_k))
        st.values = st.values.gather(2, idx[..., None].expand(-1, -1, -1, d_v))
        st.positions = st.positions.gather(2, idx)
        if st.acc is not None:
            st.acc = self._acc(st).gather(2, idx)
        st.pruned = True

    def _forget(self, st: PolicyLayer, window: int) -> None:
        """A sliding-window layer drops the rows no later query can see (position <= seen -
        window), as transformers' own sliding layers do, so its bytes stop growing at the
        window. Lanes hold one row count: where a policy left lanes with different numbers
        of rows in the window, each keeps its newest rows up to the largest such number
        (the window mask hides any older one). The far tier never gets them: no later query
        looks for them."""
        in_window = (st.positions > st.seen - window).sum(-1)  # [B, n_kv]
        keep = int(in_window.max())
        if keep == st.positions.shape[-1]:
            return
        newest = st.positions.topk(keep, dim=-1).indices
        idx = newest.sort(dim=-1).values  # slots in their order
        d_k, d_v = st.keys.shape[-1], st.values.shape[-1]
        st.keys = st.keys.gather(2, idx[..., None].expand(-1, -1, -1, d_k))
        st.values = st.values.gather(2, idx[..., None].expand(-1, -1, -1, d_v))
        if st.acc is not None:
            st.acc = self._acc(st).gather(2, idx)
        st.positions = st.positions.gather(2, idx)
        st.pruned = True

    def _to_far(self, st: PolicyLayer, layer: int, idx: torch.Tensor) -> None:
        """Recall: every slot a lane drops goes to the far tier before the rows are freed."""
        assert self.far is not None
        B, n_kv, L = st.positions.shape
        for b in range(B):
            for h in range(n_kv):
                gone = torch.ones(L, dtype=torch.bool, device=idx.device)
                gone[idx[b, h]] = False
                lane = layer * n_kv + h
                self.far.put(b, lane, st.positions[b, h, gone], st.keys[b, h, gone],
                             st.values[b, h, gone])  # fmt: skip


def _row(t: torch.Tensor, b: int) -> torch.Tensor:
    return t[b]
