"""The event loop: continuous batching with chunked prefill, prefix reuse and preemption.

Per step: admit waiting requests first-come-first-served while the pool has room and the
step's token budget has tokens left after the running requests, as the engine's scheduler
does (a request's prefix hits are found block by block among committed blocks and those its
step completes; a tier hit schedules a transfer); give every decoding request one token (a
page when it crosses a page boundary; if none can be had, the most recently admitted request
is preempted and will be recomputed); fill the rest of the token budget with prefill chunks
in admission order; price the step; advance the clock; commit the blocks the chunks
completed. A request admitted for a step also hits the blocks that chunks of requests before
it in that step complete (as in the engine, and in vLLM: requests arriving together with one
new prefix compute it once).

Speed: a step costs work proportional to the running requests, pages are integer counts,
and stretches of decode-only steps (nothing to admit, no prefill) are advanced in one go
with numpy, up to the next finish, arrival or page shortage. That keeps a 12,000-request
hour of production traffic to seconds of wall time.
"""

from __future__ import annotations

import bisect
from collections import deque

import numpy as np

from ctxlab.errors import CtxlabError
from ctxlab.sim.admission import Admission
from ctxlab.sim.config import Setup
from ctxlab.sim.state import DECODE, DONE, PREFILL, WAITING, Counters, Seq, Timeline
from ctxlab.sim.steptime import StepTime
from ctxlab.sim.trace import Request


class Simulator:
    """One serving instance replaying jobs (request, arrival time) against a setup."""

    def __init__(
        self,
        setup: Setup,
        step_time: StepTime,
        block_tokens: int,
        prefix_reuse: bool = True,
        prefill_only: bool = False,
        check: bool = False,
    ) -> None:
        cfg = setup.config
        if block_tokens % cfg.page_size:
            raise CtxlabError(
                f"page size {cfg.page_size} must divide the trace's hash block size "
                f"{block_tokens}, so pages map onto blocks"
            )
        self.setup = setup
        self.counters = Counters()
        self.admission = Admission(setup, self.counters, block_tokens, prefix_reuse, prefill_only)
        self.pool = self.admission.pool
        self.P = cfg.page_size
        self.page_bytes = self.admission.page_bytes
        self.slot_bytes = self.admission.slot_bytes
        self.prefill_only = prefill_only
        self.step_time = step_time
        self.timeline = Timeline()
        self.check = check

    # -- the loop -----------------------------------------------------------------------
    def run(self, jobs: list[tuple[Request, float]], prefilled: bool = False) -> list[Seq]:
        """Replay jobs (request, arrival seconds), sorted by arrival; finished Seqs."""
        seqs = [Seq(req, t, prefilled) for req, t in jobs]
        seqs.sort(key=lambda q: (q.arrival, q.req.index))
        self.admission.check_fits(seqs)
        self.waiting: deque[Seq] = deque()
        self.resume: list[Seq] = []
        self.running: list[Seq] = []
        self.done: list[Seq] = []
        cfg = self.setup.config
        n, ai, now = len(seqs), 0, 0.0
        c = self.counters
        while True:
            while ai < n and seqs[ai].arrival <= now:
                self.waiting.append(seqs[ai])
                ai += 1
            self._admit_all(now)
            running = self.running
            if not running:
                if self.waiting or self.resume:
                    raise AssertionError("nothing runs yet the queue head cannot be admitted")
                if ai == n:
                    break
                now = seqs[ai].arrival
                continue
            c.peak_running = max(c.peak_running, len(running))
            blocked = bool(self.waiting or self.resume) or len(running) >= cfg.max_running
            if all(s.state == DECODE for s in running):
                horizon = float("inf") if (blocked or ai == n) else seqs[ai].arrival
                advanced = self._decode_stretch(now, horizon)
                if advanced is not None:
                    now = advanced
                    continue
            now = self._step(now, seqs[ai].arrival if ai < n else float("inf"))
        return self.done

    def _admit_all(self, now: float) -> None:
        """Admit from the queue head while the pool has room and this step's token budget
        has tokens left after the running requests (as the engine's scheduler does), so a
        request looks its prefix up only when it can start, not while it would only wait."""
        if not (self.resume or self.waiting):
            return
        cfg = self.setup.config
        budget = cfg.chunk_tokens
        for s in self.running:
            budget -= self._wants(s, now)
            if budget <= 0:
                return
        # How far each prefill chunk of this step goes, as `_step` will cut them (decode
        # tokens first, then chunks in running order): what an admitted request can hit.
        chunk_budget = cfg.chunk_tokens - sum(1 for s in self.running if s.state == DECODE)
        reach: dict[int, int] = {}

        def plan_chunk(s: Seq) -> None:
            nonlocal chunk_budget
            if s.state == PREFILL and s.ready_at <= now and chunk_budget > 0:
                take = min(s.target - s.computed, chunk_budget)
                reach[id(s)] = s.computed + take
                chunk_budget -= take

        for s in self.running:
            plan_chunk(s)
        while len(self.running) < cfg.max_running and budget > 0:
            queue_is_resume = bool(self.resume)
            if queue_is_resume:
                s = self.resume[0]
            elif self.waiting:
                s = self.waiting[0]
            else:
                return
            if not self.admission.try_admit(s, now, reach):
                return
            if queue_is_resume:
                self.resume.pop(0)
            else:
                self.waiting.popleft()
            self.running.append(s)
            plan_chunk(s)
            budget -= self._wants(s, now)

    @staticmethod
    def _wants(s: Seq, now: float) -> int:
        """Tokens `s` would take from this step's budget if it had all it needs."""
        if s.state == DECODE:
            return 1
        if s.state == PREFILL and s.ready_at <= now:
            return s.target - s.computed
        return 0

    def _sample(self, now: float) -> None:
        tl, pool = self.timeline, self.pool
        tl.time.append(now)
        tl.used.append(pool.used)
        tl.cached.append(pool.evictable)
        tl.tier.append(pool.tier_used)
        tl.running.append(len(self.running))

    def _step(self, now: float, next_arrival: float) -> float:
        """One mixed step (decode tokens plus prefill chunks); returns the new clock."""
        cfg, P, pool, c = self.setup.config, self.P, self.pool, self.counters
        load = self.setup.cost.new_load()
        preempted_before = c.preemptions
        running = self.running
        decoding = [s for s in running if s.state == DECODE]
        hungry = [s for s in decoding if s.computed >= s.pages * P]
        for s in hungry:
            if s.state != DECODE:
                continue
            while not pool.reserve(self.page_bytes):
                victim = self.running.pop()
                self._preempt(victim)
                if victim is s:
                    break
            if s.state == DECODE:
                s.pages += 1
                s.private += 1
        if hungry and self.counters.preemptions != preempted_before:
            decoding = [s for s in decoding if s.state == DECODE]
        if decoding:
            self.setup.cost.add_decode(load, [s.computed for s in decoding])
        budget = cfg.chunk_tokens - len(decoding)
        chunks: list[tuple[Seq, int]] = []
        wake = float("inf")
        for s in self.running:
            if budget <= 0:
                break
            if s.state != PREFILL:
                continue
            if s.ready_at > now:
                wake = min(wake, s.ready_at)
                continue
            take = min(s.target - s.computed, budget)
            self.setup.cost.add_prefill(load, take, s.computed)
            chunks.append((s, take))
            budget -= take
        if not decoding and not chunks:
            nxt = min(wake, next_arrival)
            if nxt == float("inf"):
                raise AssertionError("no work and no event ahead")
            return max(nxt, now)
        dt = self.step_time.seconds(load)
        now += dt
        c.steps += 1
        tl = self.timeline
        if decoding:
            tl.itl_durations.append(np.array([dt]))
            tl.itl_counts.append(len(decoding))
        finished = False
        for s in decoding:
            s.computed += 1
            s.generated += 1
            s.last_token = now
            if s.first_token < 0:  # a prefilled request's first token (decode side)
                s.first_token = now
            if s.generated >= s.out:
                self._finish(s, now)
                finished = True
        c.decode_tokens_run += len(decoding)
        c.tokens_emitted += len(decoding)
        for s, take in chunks:
            s.computed += take
            self.admission.commit(s)
            c.prefill_tokens_run += take
            if s.computed == s.target:
                self._prefill_done(s, now)
                if s.state == DONE:
                    finished = True
        if finished:
            self.running = [s for s in self.running if s.state != DONE]
        self._sample(now)
        if self.check:
            self.check_invariants()
        return now

    def _prefill_done(self, s: Seq, now: float) -> None:
        assert not s.owned, "a finished prefill left blocks uncommitted"
        s.state = DECODE
        s.generated += 1
        self.counters.tokens_emitted += 1
        if s.first_token < 0:
            s.first_token = now
        else:
            self.timeline.itl_extra.append(now - s.last_token)
        s.last_token = now
        if self.prefill_only or s.generated >= s.out:
            self._finish(s, now)

    def _decode_stretch(self, now: float, horizon: float) -> float | None:
        """Advance k decode-only steps at once; None when not even one fits."""
        P, pool, pb = self.P, self.pool, self.page_bytes
        running = self.running
        ctx = np.fromiter((s.computed for s in running), dtype=np.int64, count=len(running))
        held = np.fromiter((s.pages for s in running), dtype=np.int64, count=len(running))
        left = np.fromiter((s.out - s.generated for s in running), dtype=np.int64)
        k = int(left.min())
        avail = pool.available()

        def pages_for(steps: int) -> int:
            return int(np.maximum(-(-(ctx + steps) // P) - held, 0).sum())

        if pb and avail != float("inf") and pages_for(k) * pb > avail:
            lo, hi = 0, k  # largest steps with pages_for(steps) * pb <= avail
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if pages_for(mid) * pb <= avail:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        if k <= 1:
            return None
        durations = self.step_time.decode_stretch(ctx, k)
        if horizon != float("inf"):
            starts = now + np.concatenate(([0.0], np.cumsum(durations[:-1])))
            k = int(np.searchsorted(starts, horizon, side="left"))
            if k <= 1:
                return None
            durations = durations[:k]
        new = np.maximum(-(-(ctx + k) // P) - held, 0)
        ok = pool.reserve(int(new.sum()) * pb)
        assert ok
        end = now + float(durations.sum())
        finished = False
        for s, add in zip(running, new.tolist(), strict=True):
            s.computed += k
            s.generated += k
            s.pages += add
            s.private += add
            s.last_token = end
            if s.first_token < 0:  # a prefilled request's first token (decode side)
                s.first_token = now + float(durations[0])
            if s.generated >= s.out:
                self._finish(s, end)
                finished = True
        n = len(running)
        c = self.counters
        c.steps += k
        c.decode_tokens_run += n * k
        c.tokens_emitted += n * k
        self.timeline.itl_durations.append(durations)
        self.timeline.itl_counts.append(n)
        if finished:
            self.running = [s for s in running if s.state != DONE]
        self._sample(end)
        if self.check:
            self.check_invariants()
        return end

    def _preempt(self, s: Seq) -> None:
        self.admission.release(s)
        s.state = WAITING
        s.preemptions += 1
        self.counters.preemptions += 1
        bisect.insort(self.resume, s, key=lambda q: q.req.index)

    def _finish(self, s: Seq, now: float) -> None:
        s.state = DONE
        s.finish = now
        self.admission.release(s)
        self.done.append(s)

    def check_invariants(self) -> None:
        private = sum(s.private * self.page_bytes + self.slot_bytes for s in self.running)
        self.pool.check(private)
        for s in self.running:
            assert s.pages * self.P >= s.computed, "a request holds fewer pages than tokens"
