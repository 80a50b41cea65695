"""The engine's policy runtime: it collects observations, asks the policy, and executes.

At run time control flows down: the runner calls the runtime, the runtime shows the policy
what it asked to see and gets a decision back, and the runtime executes it (compaction and
freeing in `KVCacheManager.compact_lanes`, pages and far rows through its readers). A
policy never calls back. The runner calls three hooks, the same on every engine:
- `begin_step(items)` before the plan is built: which sequences run this step (a sequence
  seen at another start than expected was recomputed: fresh state); it answers what
  attention must do for the policy (`PolicyReads`, plain data the plan carries): keep some
  queries (the observation window), return decode probabilities (H2O's scores come from
  the decode attention itself, one read of the cache), read each layer at its own width
  (per-layer budgets), narrow reads to chosen pages (`PageReads`, which also wants the keys
  written, for its block summaries), add far rows (`FarReads`), mask prefill with the
  policy's pattern (`Policy.prefill_mask`: the Longformer and BigBird `-prefill` forms).
  The page and far readers are the runtime's; attention is given them once and asks them
  per layer, because their choice depends on the layer's query;
- `end_step(readback)` after the forward, with what attention observed (`StepReadback`:
  kept queries, decode probabilities, keys written): the page summaries are updated, the
  prompt-end hook runs when a prompt is complete, the decode hook after each generated
  token, and, for purely positional policies, a cut after every prefill chunk (so a prompt
  far longer than the budget never sits whole in the pool);
- `position_offset(seq_id)`: how far cache-slot positions (StreamingLLM) run behind
  original ones; the runner subtracts it from each new token's position.
`NullRuntime` answers all of them for an engine without a policy, so the engine never asks
whether it has one.

On a model with sliding-window layers a policy acts on the full-attention layers only
(`policy_layers`): a sliding layer already keeps just its window and is never cut, scored
or observed; the policies that cannot work that way are refused when the runtime is built
(`ctxlab.policy.windowed`).

Cost: during decode a lane is cut only once it is `decode_trigger` tokens over its budget
(by default one block less one token), which layers are over is one comparison per
sequence, and a cut compacts every lane of a sequence in one batched pass. Keys are
gathered only for policies that read them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from ctxlab.engine.far_reads import FarReads
from ctxlab.engine.observe import QueryLog, SeqState, lane_keys, move_rows
from ctxlab.engine.page_reads import PageReads
from ctxlab.engine.step_plan import PolicyReads, StepReadback
from ctxlab.errors import CtxlabError
from ctxlab.kv.manager import KVCacheManager
from ctxlab.kv.seq_kv import SeqKV
from ctxlab.policy.base import Hook, Keep, Policy
from ctxlab.policy.observation import LAYER_NEEDS, LayerObs, observe_layer


@dataclass
class StepItem:
    """One sequence's share of an engine step (built by the runner from its batch)."""

    seq_id: int
    kv: SeqKV
    start: int  # original position of the first new token (= tokens cached before)
    num_new: int
    prompt_len: int
    samples: bool  # the step reaches the sequence's last token (prefill end or decode)


class NullRuntime:
    """The runtime of an engine without a policy: every hook does nothing."""

    unbounded_positions = False
    compactions = 0
    obs_window = 0  # no prompt queries are read
    pages: PageReads | None = None
    far: FarReads | None = None

    def begin_step(self, items: list[StepItem]) -> PolicyReads:
        return PolicyReads()

    def end_step(self, readback: StepReadback) -> None:
        pass

    def position_offset(self, seq_id: int) -> int:
        return 0

    def release(self, seq_id: int) -> None:
        pass

    def pool_need(self, need: int, prompt_len: int, chunk: int) -> int:
        return need


class PolicyRuntime(NullRuntime):
    def __init__(self, policy: Policy, kv: KVCacheManager, n_heads: int, rope: Any = None):
        self.policy = policy
        self.kv = kv
        self.layout = kv.layout
        self.n_heads = n_heads
        self.n_kv = self.layout.n_kv_heads
        # The layers a retention policy acts on: every full-attention layer. A sliding layer
        # already keeps only its window (`KVCacheManager.slide`) and its lanes must keep
        # lane index = position, so it is never cut.
        windows = self.layout.windows or (None,) * self.layout.n_layers
        self.policy_layers = [i for i, w in enumerate(windows) if w is None]
        self._policy_layer = torch.tensor([w is None for w in windows])
        self.rope = rope
        self.needs = policy.needs
        self.states: dict[int, SeqState] = {}
        self.items: list[StepItem] = []
        self.obs_window = policy.query_window()  # queries logged only as far back as read
        # Decisions that need no observation of the layer: cut after every prefill chunk.
        self.positional = policy.evicts and not (self.needs & set(LAYER_NEEDS))
        self.pages = PageReads(policy, kv) if "pages" in self.needs else None  # type: ignore[arg-type]
        self.far = FarReads(policy, self.layout) if "far" in self.needs else None  # type: ignore[arg-type]
        self.scores_in_attention = "acc_attn" in self.needs  # H2O: from decode attention
        self.uneven_layers = False  # set once a sequence gets per-layer budgets (PyramidKV)
        self.trigger = policy.decode_trigger(self.layout.block_size)
        self.masks_prefill = policy.prefill_key(1) is not None  # a pattern in prefill too
        self._q_rows: torch.Tensor | None = None
        self.compactions = 0

    @property
    def unbounded_positions(self) -> bool:  # type: ignore[override]
        """Cache-slot positions with a bounded cache: no limit from the trained length."""
        return self.positional and self.policy.position_mode == "cache-slot" and bool(self.rope)

    def pool_need(self, need: int, prompt_len: int, chunk: int) -> int:
        """Tokens per lane one request can hold at once under this policy (admission check)."""
        cap = self.policy.resident_tokens(prompt_len) if self.positional else None
        return need if cap is None else min(need, cap + self.trigger + chunk)

    def position_offset(self, seq_id: int) -> int:
        st = self.states.get(seq_id)
        return st.pos_shift if st is not None else 0

    def release(self, seq_id: int) -> None:
        self.states.pop(seq_id, None)
        if self.far is not None:
            self.far.release(seq_id)

    # -- before and around the forward -----------------------------------------------------
    def begin_step(self, items: list[StepItem]) -> PolicyReads:
        row = 0
        keep_rows = []
        for it in items:
            if self.obs_window:  # only the rows a query log will hold
                keep_rows.append(
                    torch.arange(max(row, row + it.num_new - self.obs_window), row + it.num_new)
                )
            row += it.num_new
            st = self.states.get(it.seq_id)
            if st is None or it.start != st.next_start:  # new, or recomputed after preemption
                self.release(it.seq_id)
                st = self.states[it.seq_id] = SeqState(prompt_len=it.prompt_len)
            st.next_start = it.start + it.num_new
        self._q_rows = torch.cat(keep_rows) if keep_rows else None
        self.items = items
        decode = [it for it in items if it.num_new == 1]  # the decode rows, in order
        if self.pages is not None:  # pages per decode row, for this step's choices
            self.pages.begin_step([it.prompt_len for it in decode])
        if self.far is not None:
            self.far.step_rows = [(it.seq_id, self.states[it.seq_id].step) for it in decode]
        return PolicyReads(
            keep_queries=None if self._q_rows is None else self._q_rows.to(self.kv.pool.device),
            want_probs=self.scores_in_attention,
            own_width=self.uneven_layers,
            pages=self.pages is not None,
            far=self.far is not None,
            record_keys=self.pages is not None,
            prefill_mask=self.policy.prefill_mask if self.masks_prefill else None,
        )

    @torch.inference_mode()
    def end_step(self, readback: StepReadback) -> None:
        pol = self.policy
        if self.pages is not None:  # block summaries of the keys this step wrote
            for written in readback.keys:
                if written is not None:
                    self.pages.record(*written)
        if self.obs_window and self._q_rows is not None:
            self._store_queries(readback)
        if any(p is not None for p in readback.probs):  # a sliding layer 0 gives none
            self._accumulate(readback)
        for it in self.items:
            st = self.states[it.seq_id]
            if not it.samples:
                if self.positional:
                    self._cut(it, st, pol.on_prefill, 0)
                continue
            if not st.prefilled:
                st.prefilled = True
                if pol.evicts:
                    self._cut(it, st, pol.on_prefill, 0, seed=True)
            else:
                st.step += 1
                if pol.evicts and pol.wants_decode_hook(st.step):
                    self._cut(it, st, pol.on_decode, self.trigger)
        self.items = []

    def _store_queries(self, readback: StepReadback) -> None:
        lay = self.layout
        qs = torch.stack(readback.queries).float().cpu()  # [n_layers, R, H, d]: item by item
        at = 0
        for it in self.items:
            st = self.states[it.seq_id]
            m = min(it.num_new, self.obs_window)
            if st.log is None:
                st.log = QueryLog(lay.n_layers, self.n_heads, self.obs_window, qs.shape[-1])
            st.log.append(qs[:, at : at + m], it.start + it.num_new - m)
            at += m

    def _accumulate(self, readback: StepReadback) -> None:
        """Add this step's decode attention (from attention itself) to each H2O score."""
        # Per layer, the query heads of each KV head summed: [B, n_lanes, L]; a sliding
        # layer (never cut, so never scored) leaves its lanes at zero.
        first = next(p for p in readback.probs if p is not None)
        B, n_kv, _, L = first.shape
        probs = torch.zeros(B, self.layout.n_lanes, L)
        for layer, p in enumerate(readback.probs):
            if p is not None:
                probs[:, layer * n_kv : (layer + 1) * n_kv] = p.sum(2).float().cpu()
        dec = [it for it in self.items if it.num_new == 1]  # the decode batch, in order
        for b, it in enumerate(dec):
            st = self.states[it.seq_id]
            if st.prefilled:  # a 1-token last prefill chunk is counted by the prefill seed
                st.acc_rows(self.layout.n_lanes, L)[:, :L] += probs[b]

    # -- cutting --------------------------------------------------------------------------
    def _lane_budgets(self, st: SeqState) -> torch.Tensor | None:
        """Tokens each lane may keep (per layer for PyramidKV), computed once per sequence;
        None for a policy without a budget."""
        if st.budgets is None:
            lay = self.layout
            per_layer = []
            for layer in range(lay.n_layers):
                light = LayerObs(
                    layer, lay.n_layers, self.n_heads, torch.empty(self.n_kv, 0), 0, st.prompt_len
                )
                per_layer.append(self.policy.lane_budget(light))
            if any(b is None for b in per_layer):
                return None
            st.budgets = torch.tensor(per_layer, dtype=torch.int64).repeat_interleave(self.n_kv)
            # Layers of different budgets: let each layer's decode read only its own width.
            self.uneven_layers = self.uneven_layers or len(set(per_layer)) > 1
        return st.budgets

    def _layers_over(self, it: StepItem, st: SeqState, trigger: int) -> list[int]:
        """Layers with a lane over `budget + trigger`: one comparison for every lane."""
        budgets = self._lane_budgets(st)
        if budgets is None:
            return list(self.policy_layers)
        over = (it.kv.lane_len > budgets + trigger).view(self.layout.n_layers, self.n_kv).any(1)
        return torch.nonzero(over & self._policy_layer).flatten().tolist()

    def _cut(
        self, it: StepItem, st: SeqState, hook: Hook, trigger: int, seed: bool = False
    ) -> None:
        """Ask the policy about every layer over budget, then compact all cut lanes at once."""
        lay = self.layout
        seed = seed and "acc_attn" in self.needs  # H2O seeds every layer's scores
        layers = list(self.policy_layers) if seed else self._layers_over(it, st, trigger)
        if not layers:
            return
        q_all, q_pos = st.log.ordered() if st.log is not None else (None, None)
        lanes: list[int] = []
        keep: Keep = []
        for layer in layers:
            lanes_of = lay.lanes_of_layer(layer)
            pos = self.kv.lane_positions(it.kv, lanes_of)
            n = pos.shape[1]
            obs = observe_layer(
                layer=layer, n_layers=lay.n_layers, n_heads=self.n_heads, positions=pos,
                seq_len=it.start + it.num_new, prompt_len=st.prompt_len, step=st.step,
                needs=self.needs, keys=partial(lane_keys, self.kv, it.kv, layer, n),
                queries=q_all[layer] if q_all is not None else None, query_pos=q_pos,
                acc=st.acc_rows(lay.n_lanes, n)[lanes_of, :n] if "acc_attn" in self.needs
                else None,
                seed=seed,
            )  # fmt: skip
            kept = hook(obs)
            if kept is None:
                continue
            first = lay.lanes_of_layer(layer).start
            lens = it.kv.lane_len[first : first + self.n_kv].tolist()
            for h, slots in enumerate(self.kv.slots_of(obs.positions, kept)):
                if len(slots) == lens[h]:
                    continue
                lanes.append(first + h)
                keep.append(slots)
        fits = self.kv.compaction_fits(it.kv, lanes, keep)  # a full pool: cut what fits
        if len(fits) != len(lanes):
            lanes, keep = [lanes[i] for i in fits], [keep[i] for i in fits]
        if not lanes:
            return
        if self.far is not None:  # what leaves the pool goes to the far tier first
            for lane, slots in zip(lanes, keep, strict=True):
                positions = self.kv.lane_positions(it.kv, [lane])[0]
                self.far.evict(self.kv, it.kv, it.seq_id, lane, positions, slots)
        if st.acc is not None:  # scores move with their tokens
            move_rows(st.acc, lanes, keep)
        cache_slot = self.policy.position_mode == "cache-slot" and self.rope is not None
        self.kv.compact_lanes(it.kv, lanes, keep, self.rope if cache_slot else None)
        self.compactions += len(lanes)
        if cache_slot:
            st.pos_shift = it.start + it.num_new - int(it.kv.lane_len.max())


def resolve_policy(policy: Any, budget: Any, kv_format: str | None) -> Policy | None:
    """What a user passed (`policy=` a name or a `Policy`, `budget=`, `kv_format=`) as one
    policy object, a storage format wrapping it when `kv_format` is given; None: none."""
    from ctxlab.policy.quant import QuantPolicy
    from ctxlab.policy.registry import POLICIES, make_policy

    if policy is None and budget is not None:
        raise CtxlabError("a budget needs a policy; pass policy= (e.g. 'snapkv') as well.")
    if isinstance(policy, str):
        # A storage format named alone (`quant`) takes kv_format as its format.
        cls = POLICIES.get(policy)
        takes_fmt = cls is not None and "fmt" in {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        params = {"fmt": kv_format} if kv_format and takes_fmt else {}
        policy = make_policy(policy, budget, **params)
    elif policy is not None and not isinstance(policy, Policy):
        raise CtxlabError(f"policy must be a name or a Policy, got {type(policy).__name__}.")
    elif budget is not None:
        raise CtxlabError("give the budget inside the Policy object or by name, not both.")
    if policy is not None:
        policy.check()
    if kv_format is None:
        return policy
    own = policy.storage()[0] if policy is not None else None
    if own is not None:
        if own != kv_format:
            raise CtxlabError(
                f"the policy stores {own} but kv_format is {kv_format}; give one of them."
            )
        return policy
    wrapped = QuantPolicy(fmt=kv_format, base=policy)
    wrapped.check()
    return wrapped


def build_runtime(
    policy: Policy | None,
    kv: KVCacheManager,
    n_heads: int,
    rope: Any = None,
    sliding_windows: tuple[int | None, ...] = (),
) -> NullRuntime:
    """The runtime that drives `policy`, or the null one when it neither evicts nor asks
    the engine for anything (no policy, `full`, a storage format alone)."""
    if any(w is not None for w in sliding_windows):
        from ctxlab.policy.windowed import check_windowed

        check_windowed(policy)  # the same sentence the CLI gives before the model loads
    if policy is None or not (policy.evicts or policy.needs):
        return NullRuntime()
    return PolicyRuntime(policy, kv, n_heads, rope)
