"""Continuous batching with chunked prefill and preemption by recompute.

Each step has a token budget (`max_num_batched_tokens`). Running sequences go first, in
arrival order: a decoding one takes 1 token, one still in prefill takes the next chunk that
fits. Then waiting sequences are admitted (prefix-cache hit first, then a chunk of the rest)
while budget, `max_num_seqs` and the pool allow. When the pool cannot give a running
sequence its next slots, the most recently admitted running sequence is preempted: its
blocks are freed and it goes back to the head of the waiting queue, to be recomputed later.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ctxlab.engine.sequence import Sequence, Status
from ctxlab.kv.manager import KVCacheManager


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

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
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
        if preempted:
            return out
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit = self.kv.lookup_prefix(seq.kv, seq.token_ids, seq.cache_salt)
            n = min(seq.num_tokens - hit.num_tokens, budget)
            if not self.kv.allocate(seq.kv, hit.num_tokens + n, hit, seq.num_tokens):
                break
            self.waiting.popleft()
            if not seq.admitted:
                seq.admitted = True
                seq.metrics.reused_tokens = hit.num_tokens
            seq.num_computed = hit.num_tokens
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.append(ScheduledSeq.of(seq, n))
            budget -= n
        return out

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq.kv)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.metrics.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.metrics.resident_kv_bytes = self.kv.resident_bytes(seq.kv)
        self.kv.free(seq.kv)
        self.running.remove(seq)
