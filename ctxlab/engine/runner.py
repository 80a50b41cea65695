"""Builds the flat batch of a step and its plan, runs the model over the paged pool, samples.

One step, top to bottom (`run`): the policy's runtime learns which sequences run (its own
state only); each sequence's lanes take its new tokens (`_grow`: the one change to the cache
before the forward); `plan` builds the flat token ids, their positions and the `StepPlan`,
plain data that nothing writes afterwards (pool rows, prefill chunks, and every decode read
per layer with its path, the kernel chosen here once per step); the model's forward reads
it through `PagedAttention`; the runtime reads what attention observed. The scheduled
sequences' new tokens are laid end to end (`input_ids[T]`, `positions[T]`). Logits are
computed only for the last token of sequences that sample.
"""

from __future__ import annotations

import torch

from ctxlab.engine.attention import PagedAttention
from ctxlab.engine.decode_reads import plan_decode
from ctxlab.engine.kernels.paged_decode import serves as kernel_serves
from ctxlab.engine.phase_threads import step_threads
from ctxlab.engine.policy_runtime import NullRuntime, StepItem
from ctxlab.engine.sampling import sample
from ctxlab.engine.scheduler import ScheduledSeq
from ctxlab.engine.step_plan import PolicyReads, PrefillItem, StepPlan
from ctxlab.kv.manager import KVCacheManager


class Runner:
    def __init__(
        self,
        model: torch.nn.Module,
        kv: KVCacheManager,
        n_heads: int,
        sliding_windows: tuple[int | None, ...] = (),
        runtime: NullRuntime | None = None,
    ):
        self.model = model
        self.kv = kv
        self.layout = kv.layout
        self.runtime = runtime or NullRuntime()  # a policy's runtime (engine/policy_runtime)
        self.windows = sliding_windows
        self.backend = PagedAttention(
            kv.pool,
            n_heads,
            sliding_windows,
            self.runtime.pages,
            self.runtime.far,
            getattr(model, "prefill_attention_dtype", None),
        )
        self.in_place = True  # long dense lanes read in place (False: gathered, to compare)
        self.device = kv.pool.device

    def _grow(self, sch: ScheduledSeq) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's lanes take its `num_new` tokens: (pool rows `[n_lanes, n]` they go
        to, each lane's length before)."""
        seq, n = sch.seq, sch.num_new
        prev_len = seq.kv.lane_len.clone()
        rows = self.kv.slot_rows(seq.kv, n)
        self.kv.advance(seq.kv, n, first_pos=seq.num_computed)
        return rows, prev_len

    def plan(
        self,
        batch: list[ScheduledSeq],
        grown: list[tuple[torch.Tensor, torch.Tensor]],
        asked: PolicyReads,
    ) -> tuple[torch.Tensor, torch.Tensor, StepPlan]:
        """Token ids, positions and the step plan, from the batch after `_grow` (its rows and
        lengths before, `grown`) and what the policy's runtime asked for; changes nothing."""
        lay = self.layout
        ids: list[int] = []
        pos: list[int] = []
        rows: list[torch.Tensor] = []
        dec_idx: list[int] = []
        dec_seqs = []
        prefills: list[PrefillItem] = []
        t = 0
        for sch, (seq_rows, prev_len) in zip(batch, grown, strict=True):
            seq, n = sch.seq, sch.num_new
            start = seq.num_computed
            ids.extend(seq.token_ids[start : start + n])
            off = self.runtime.position_offset(seq.seq_id)
            pos.extend(range(start - off, start - off + n))
            rows.append(seq_rows)
            if n == 1:
                dec_idx.append(t)
                dec_seqs.append(seq)
            else:
                fresh = bool(prev_len.max() == 0)
                table = None if fresh else seq.kv.table[:, : seq.kv.max_blocks]
                prev = None if fresh else prev_len
                item = PrefillItem(t, t + n, fresh, table, prev, start, seq.num_prompt)
                prefills.append(item)
            t += n
        T = t
        # [layers, T, heads], each layer's rows contiguous: the pool's compiled row write
        # takes them as they are (a transposed view sent every write through aten)
        flat_rows = torch.cat(rows, 1).view(lay.n_layers, lay.n_kv_heads, T).transpose(1, 2)
        flat_rows = flat_rows.contiguous()
        decode_idx = None
        decode, unnarrowed = [], []
        if dec_seqs:
            nb = max(s.kv.max_blocks for s in dec_seqs)
            table = torch.zeros(len(dec_seqs), lay.n_lanes, nb, dtype=torch.int64)
            lens = torch.empty(len(dec_seqs), lay.n_lanes, dtype=torch.int64)
            for i, s in enumerate(dec_seqs):
                m = s.kv.max_blocks
                table[i, :, :m] = s.kv.table[:, :m]
                lens[i] = s.kv.lane_len
            L = nb * lay.block_size
            mask = (torch.arange(L).view(1, 1, L) < lens.unsqueeze(-1)).unsqueeze(2)
            decode_idx = torch.tensor(dec_idx, dtype=torch.int64)
            pool = self.backend.pool
            kernel = kernel_serves(pool)  # the decode kernel, chosen once for the step
            views = self.in_place and pool.views
            decode, unnarrowed = plan_decode(table, mask, lay, self.windows, views, kernel, asked)
        plan = StepPlan(flat_rows, prefills, decode_idx, decode, unnarrowed, asked)
        return (
            torch.tensor(ids, dtype=torch.int64, device=self.device),
            torch.tensor(pos, dtype=torch.int64, device=self.device),
            plan,
        )

    @torch.inference_mode()
    def run(self, batch: list[ScheduledSeq]) -> list[int]:
        """Run one step; returns one sampled token per sequence that samples, in order."""
        decode = sum(1 for sch in batch if sch.num_new == 1)
        with step_threads(decode, sum(sch.num_new for sch in batch) - decode):  # per phase
            return self._run(batch)

    def _run(self, batch: list[ScheduledSeq]) -> list[int]:
        sampling = [sch for sch in batch if sch.samples]
        ends = []
        t = 0
        for sch in batch:
            t += sch.num_new
            if sch.samples:
                ends.append(t - 1)
        asked = self.runtime.begin_step([_step_item(sch) for sch in batch])
        grown = [self._grow(sch) for sch in batch]
        input_ids, positions, plan = self.plan(batch, grown, asked)
        self.backend.begin_step(plan)
        try:
            hidden = self.model.forward(input_ids, positions, self.backend)
        finally:
            readback = self.backend.end_step()
        # Full blocks go to the prefix cache as computed, before a policy cuts them: a later
        # request with the same prefix reuses the whole prompt's state and makes its own cut.
        for sch in batch:
            self.kv.commit(sch.seq.kv, sch.seq.token_ids, sch.seq.cache_salt)
        self.runtime.end_step(readback)  # the policy keeps what it keeps; the rest is freed
        for sch in batch:  # sliding lanes hand back what their windows no longer read
            self.kv.slide(sch.seq.kv)
        self._score_prompts(batch, hidden)
        if not sampling:
            return []
        logits = self.model.compute_logits(hidden[torch.tensor(ends, dtype=torch.int64)])
        return sample(
            logits,
            [sch.seq.params for sch in sampling],
            [sch.seq.generator for sch in sampling],
        )

    def _score_prompts(self, batch: list[ScheduledSeq], hidden: torch.Tensor) -> None:
        """Log-probability of each next prompt token, for sequences that asked for it.

        Computed chunk by chunk, so each token is scored against the cache as it stood when
        the token was fed (what a retention policy had kept by then), not against the text.
        """
        t = 0
        for sch in batch:
            seq, start = sch.seq, sch.seq.num_computed
            n = min(sch.num_new, seq.num_prompt - 1 - start)
            if seq.params.prompt_logprobs and n > 0:
                logits = self.model.compute_logits(hidden[t : t + n]).float()
                nxt = torch.tensor(seq.prompt_ids[start + 1 : start + 1 + n], device=logits.device)
                picked = logits.log_softmax(-1).gather(1, nxt.view(-1, 1)).view(-1)
                if len(seq.prompt_logprobs) < seq.num_prompt - 1:
                    seq.prompt_logprobs = [None] * (seq.num_prompt - 1)
                seq.prompt_logprobs[start : start + n] = picked.tolist()
            t += sch.num_new


def _step_item(sch: ScheduledSeq) -> StepItem:
    seq = sch.seq
    return StepItem(seq.seq_id, seq.kv, seq.num_computed, sch.num_new, seq.num_prompt, sch.samples)
