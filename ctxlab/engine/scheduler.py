"""Continuous batching with chunked prefill and preemption by recompute.

Each step has a token budget (`max_num_batched_tokens`). Running sequences go first, in
arrival order: a decoding one takes 1 token, one still in prefill takes the next chunk that
fits. Then waiting sequences are admitted (prefix-cache hit first, then a chunk of the rest)
while budget, `max_num_seqs` and the pool allow; a hit also takes the full blocks that
sequences earlier in the same step are about to write (`KVCacheManager.filled_by_step`), so
requests arriving together with one prefix compute it once. When the pool cannot give a running
sequence its next slots, the most recently admitted running sequence is preempted: its
blocks are freed and it goes back to the head of the waiting queue, to be recomputed later.

After a failed step (see `LLMEngine.step`) every running sequence is sent back to be
recomputed and the sequences of that step become suspects: they run one at a time, each for
`SOLO_SAMPLES` sampled tokens, so the one that fails again fails alone and the others go back
to being batched.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from ctxlab.engine.sequence import Sequence, Status
from ctxlab.kv.hashing import BlockHash
from ctxlab.kv.manager import KVCacheManager

# Tokens a suspect samples alone after a failed step: its catch-up step (a prefill-end
# failure happens again there) and one decode step (a decode-hook failure happens there).
SOLO_SAMPLES = 2


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    num_new: int  # tokens computed this step, starting at seq.num_computed
    samples: bool = False  # this step reaches the last token, so a token is sampled

    @classmethod
    def of(cls, seq: Sequence, num_new: int) -> ScheduledSeq:
        return cls(seq, num_new, seq.num_computed + num_new == seq.num_tokens)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int):
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.suspects: deque[Sequence] = deque()  # run alone, first to last
        self.solo_samples = 0  # tokens the first suspect sampled alone so far
        # Trailing prompt tokens a prefix hit leaves to compute: 1 (the logits), or the
        # query window a retention policy reads at the prompt end (set by the engine).
        self.compute_tail = 1

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        if self.suspects:
            return self._schedule_alone(self.suspects[0])
        budget = self.max_num_batched_tokens
        out: list[ScheduledSeq] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            # Room for n more tokens per lane (lanes a policy compacted hold fewer tokens).
            while not self.kv.allocate(seq.kv, seq.kv.num_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                out.append(ScheduledSeq.of(seq, n))
                budget -= n
                i += 1
        if preempted or not self.waiting:
            return out
        in_flight: dict[BlockHash, tuple[int, ...]] = {}  # full blocks this step writes
        for sch in out:
            in_flight.update(self._fills(sch))
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            sch = self._admit(self.waiting[0], budget, in_flight)
            if sch is None:
                break
            self.waiting.popleft()
            out.append(sch)
            in_flight.update(self._fills(sch))
            budget -= sch.num_new
        return out

    def _fills(self, sch: ScheduledSeq) -> dict[BlockHash, tuple[int, ...]]:
        seq = sch.seq
        return self.kv.filled_by_step(
            seq.kv, seq.token_ids, seq.cache_salt, seq.num_computed + sch.num_new
        )

    def _admit(
        self,
        seq: Sequence,
        budget: int,
        in_flight: Mapping[BlockHash, tuple[int, ...]] | None = None,
    ) -> ScheduledSeq | None:
        """Take a waiting sequence's cached prefix and room for its next chunk, or None.

        A follow-up turn (`LLMEngine.follow_up`) still holds its cache: it resumes on it, with
        no prefix lookup, from the tokens it has computed."""
        if seq.num_computed and seq.kv.max_blocks:
            n = min(seq.num_tokens - seq.num_computed, budget)
            if not self.kv.allocate(seq.kv, seq.kv.num_tokens + n):
                return None
            seq.status = Status.RUNNING
            self.running.append(seq)
            return ScheduledSeq.of(seq, n)
        hit = self.kv.lookup_prefix(
            seq.kv, seq.token_ids, seq.cache_salt, self.compute_tail, in_flight
        )
        n = min(seq.num_tokens - hit.num_tokens, budget)
        if not self.kv.allocate(seq.kv, hit.num_tokens + n, hit, seq.num_tokens):
            return None
        if not seq.admitted:
            seq.admitted = True
            seq.metrics.reused_tokens = hit.num_tokens
        seq.num_computed = hit.num_tokens
        seq.status = Status.RUNNING
        self.running.append(seq)
        return ScheduledSeq.of(seq, n)

    def _schedule_alone(self, seq: Sequence) -> list[ScheduledSeq]:
        """A step holding only `seq` (a suspect); nothing else runs while suspects remain."""
        budget = self.max_num_batched_tokens
        if seq.status is Status.WAITING:
            sch = self._admit(seq, budget)
            if sch is not None:
                self.waiting.remove(seq)
            return [] if sch is None else [sch]
        n = min(seq.num_tokens - seq.num_computed, budget)
        if not self.kv.allocate(seq.kv, seq.kv.num_tokens + n):
            return []
        return [ScheduledSeq.of(seq, n)]

    def _requeue(self, seq: Sequence) -> None:
        """Free `seq`'s blocks and put it at the head of the waiting queue, to recompute."""
        self.kv.free(seq.kv)
        seq.num_computed = 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def _preempt(self, seq: Sequence) -> None:
        self._requeue(seq)
        seq.metrics.preemptions += 1
        self.num_preemptions += 1

    def reset_running(self) -> None:
        """Send every running sequence back to be recomputed, in order (not a preemption)."""
        for seq in reversed(self.running):
            self._requeue(seq)
        self.running.clear()

    def isolate(self, seqs: list[Sequence]) -> None:
        """Make `seqs` suspects: each runs alone for `SOLO_SAMPLES` sampled tokens."""
        self.suspects.extend(s for s in seqs if s not in self.suspects)

    def stepped(self, batch: list[ScheduledSeq]) -> None:
        """Count a suspect's successful solo step; clear it after `SOLO_SAMPLES` tokens."""
        if not (self.suspects and len(batch) == 1 and batch[0].seq is self.suspects[0]):
            return
        if batch[0].samples:
            self.solo_samples += 1
            if self.solo_samples >= SOLO_SAMPLES:
                self.suspects.popleft()
                self.solo_samples = 0

    def finish(self, seq: Sequence, reason: str, keep: bool = False) -> None:
        """End `seq` wherever it is (running, waiting, a suspect) and free its blocks, unless
        `keep` (a held request: its blocks stay for a follow-up turn)."""
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.metrics.resident_kv_bytes = self.kv.resident_bytes(seq.kv)
        if not keep:
            self.kv.free(seq.kv)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.suspects:
            if seq is self.suspects[0]:
                self.solo_samples = 0
            self.suspects.remove(seq)
