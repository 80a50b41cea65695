"""`LLMEngine`: the step loop a server drives.

`add_request` then `step()` until nothing is left; each step returns the tokens it produced;
`abort` stops a request and frees its blocks. A request added with `hold=True` keeps its cache
when it ends, as its policy left it: `follow_up` asks the next turn against that same cache
(a conversation's second question after compression) and `release` frees it. One request's
failure stays that request's: a
request that cannot run under the policy is refused by `add_request`, and anything that fails
inside a step finishes that request with an error (its blocks freed) while every other request
goes on.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from ctxlab.engine.kernels.paged_decode import warm_up
from ctxlab.engine.malloc import keep_heap_pages
from ctxlab.engine.metrics import RequestMetrics
from ctxlab.engine.policy_runtime import build_runtime, resolve_policy
from ctxlab.engine.request import Prompt, RequestOutput, TokenEvent, is_chat, is_ids
from ctxlab.engine.runner import Runner
from ctxlab.engine.sampling import SamplingParams, make_generator
from ctxlab.engine.scheduler import Scheduler
from ctxlab.engine.sequence import RequestError, Sequence, Status
from ctxlab.engine_options import KV_CACHE_DTYPES
from ctxlab.errors import CtxlabError
from ctxlab.kv.layout import KVLayout
from ctxlab.kv.manager import KVCacheManager, KVStats

if TYPE_CHECKING:
    from ctxlab.kv.prefix_offload import PrefixOffload

log = logging.getLogger(__name__)


class LLMEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        config: Any,
        tokenizer: Any = None,
        kv_pool_tokens: int = 32768,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        max_num_batched_tokens: int = 4096,
        max_num_seqs: int = 64,
        model_id: str = "model",
        policy: Any = None,
        budget: Any = None,
        max_model_len: int | None = None,
        kv_format: str | None = None,
        kv_cache_dtype: str = "auto",
    ):
        """`kv_cache_dtype` "bfloat16" stores K/V in bfloat16 beside a float32 model (half the
        pool's bytes, rows widened as attention reads them; vLLM's `--kv-cache-dtype`);
        "auto" stores the model's dtype. `kv_format` stores codes instead (not both)."""
        if max_num_batched_tokens <= 0 or max_num_seqs <= 0:
            raise CtxlabError("max_num_batched_tokens and max_num_seqs must be positive.")
        if max_model_len is not None and max_model_len <= 0:
            raise CtxlabError(f"max_model_len must be positive, got {max_model_len}.")
        keep_heap_pages()  # large per-layer temporaries reuse heap pages (see malloc.py)
        self.model = model
        self.config = config
        self.tokenizer = tokenizer
        dtype = next(model.parameters()).dtype
        device = next(model.parameters()).device
        stored = cache_dtype(kv_cache_dtype, dtype)
        layout = KVLayout(
            n_layers=config.num_layers,
            n_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            head_dim_v=getattr(config, "head_dim_v", config.head_dim),
            block_size=block_size,
            dtype=stored,
            windows=tuple(getattr(config, "sliding_windows", ()) or ()),
            compute_dtype=dtype if stored != dtype else None,
        )
        # One policy object (a storage format wraps the policy when kv_format is given); the
        # pool's storage format is the model dtype or int8 / KIVI codes.
        self.policy = resolve_policy(policy, budget, kv_format)
        fmt, group = self.policy.storage() if self.policy is not None else (None, 32)
        if fmt is not None and stored != dtype:
            raise CtxlabError(
                f"the pool stores {fmt} codes; give --kv-cache-dtype bfloat16 or a KV format, "
                "not both."
            )
        self.kv = KVCacheManager(
            layout,
            kv_pool_tokens,
            enable_prefix_caching,
            device,
            extra=(model_id,) if stored == dtype else (model_id, f"kv={stored}"),
            kv_format=fmt,
            kv_group=group,
        )
        warm_up(self.kv.pool)  # the compiled decode attention loads now, not in a timed step
        self.scheduler = Scheduler(self.kv, max_num_batched_tokens, max_num_seqs)
        self._build_runtime()
        # max_model_len past the trained length is allowed on purpose: it is how a run shows
        # what RoPE extrapolation does to full attention (streaming perplexity).
        self.max_position = max_model_len or int(getattr(config, "max_position", 1 << 30))
        self.eos_ids = set(getattr(config, "eos_token_ids", ()) or ())
        if tokenizer is not None:
            self.eos_ids |= set(getattr(tokenizer, "eos_token_ids", ()) or ())
        self._ids = itertools.count()
        self.seqs: dict[int, Sequence] = {}
        self.num_failed_steps = 0
        self.offload: PrefixOffload | None = None  # see `attach_offload`

    def attach_offload(self, host_bytes: int, directory: str | None = None) -> PrefixOffload:
        """Give the prefix cache a second tier: evicted blocks spill to host memory
        (`host_bytes`) and below it to files in `directory`; later hits restore them."""
        from ctxlab.kv.prefix_offload import PrefixOffload

        if self.offload is not None:
            raise CtxlabError("this engine already has an offload tier.")
        if not self.kv.enable_prefix_caching:
            raise CtxlabError("the offload tier holds prefix-cache blocks; enable prefix caching.")
        self.offload = PrefixOffload(self.kv, host_bytes, directory)
        return self.offload

    def set_policy(self, policy: Any = None, budget: Any = None) -> None:
        """Change the retention or selection policy between requests (None: full cache).

        The prefix cache carries over: it holds blocks as they were computed, before any cut,
        so the new policy's requests reuse what earlier ones prefilled and make their own cut
        (what a comparison of policies on the same prompts needs). Refused while a request
        is queued, running or held, whose state belongs to the old policy, and for a policy
        that stores the pool in another format than the one it was built with."""
        if self.seqs:
            raise CtxlabError(
                f"{len(self.seqs)} request(s) are queued, running or held; finish or release "
                "them before changing the policy."
            )
        new = resolve_policy(policy, budget, None)
        fmt = new.storage()[0] if new is not None else None
        if fmt != self.kv.kv_format:
            raise CtxlabError(
                f"the pool stores {self.kv.kv_format or 'the model dtype'}; a policy that "
                f"stores {fmt or 'the model dtype'} needs an engine built with it."
            )
        self.policy = new
        self._build_runtime()

    def _build_runtime(self) -> None:
        """The policy runtime and the runner; built once, and again after a failed step: a
        step that raised may have left per-step state half-updated, so everything running is
        recomputed on fresh objects."""
        config = self.config
        windows = tuple(getattr(config, "sliding_windows", ()) or ())
        rope = getattr(self.model, "rope", None)
        self.runtime = build_runtime(self.policy, self.kv, config.num_heads, rope, windows)
        self.runner = Runner(self.model, self.kv, config.num_heads, windows, self.runtime)
        self.scheduler.compute_tail = max(1, self.runtime.obs_window)

    # -- requests -------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise CtxlabError("the prompt is empty; give at least one token of text.")
            return list(self._tok().encode(prompt))
        if is_chat(prompt):
            return list(self._tok().apply_chat(prompt))
        if is_ids(prompt):
            return list(prompt)
        raise CtxlabError("a prompt must be a string, a chat (list of messages) or token ids.")

    def _tok(self) -> Any:
        if self.tokenizer is None:
            raise CtxlabError("this engine has no tokenizer; pass token ids as prompts.")
        return self.tokenizer

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        cache_salt: str | None = None,
        hold: bool = False,
    ) -> int:
        """Queue a request; its id. With `hold`, its cache stays in the pool when it ends
        (stop or length) until `release`, and `follow_up` can continue it."""
        params = params or SamplingParams()
        ids = self.encode(prompt)
        if not ids:
            raise CtxlabError("the prompt is empty; give at least one token of text.")
        vocab = int(getattr(self.config, "vocab_size", 0) or 0)
        if vocab and not 0 <= min(ids) <= max(ids) < vocab:
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise CtxlabError(f"token id {bad} is outside the model's vocabulary (0..{vocab - 1}).")
        free_pos = self.runtime.unbounded_positions
        if len(ids) >= self.max_position and not free_pos:
            raise CtxlabError(
                f"the prompt has {len(ids)} tokens, more than the model's maximum of "
                f"{self.max_position - 1} prompt tokens."
            )
        self._check_policy_floor(len(ids))
        need = len(ids) + params.max_tokens
        need = need if free_pos else min(need, self.max_position)
        # A policy that cuts every chunk never holds the whole prompt.
        need = self.runtime.pool_need(need, len(ids), self.scheduler.max_num_batched_tokens)
        # Counted in blocks: a sliding layer holds at most its window plus the chunk it writes.
        chunk = min(self.scheduler.max_num_batched_tokens, need)
        if self.kv.layout.blocks_for_request(need, chunk) > self.kv.pool.num_blocks:
            raise CtxlabError(
                f"the KV pool holds {self.kv.pool_tokens} tokens but one request needs {need} "
                f"({len(ids)} prompt + {params.max_tokens} max_tokens); enlarge kv_pool_tokens."
            )
        rid = next(self._ids)
        key = self.policy.prefill_key(len(ids)) if self.policy is not None else None
        if key is not None:  # blocks computed under a prefill mask are shared under it only
            cache_salt = f"{cache_salt}|{key}" if cache_salt is not None else key
        seq = Sequence(
            seq_id=rid,
            prompt_ids=ids,
            params=params,
            kv=self.kv.new_seq(),
            metrics=RequestMetrics(arrival_time=time.perf_counter(), prompt_tokens=len(ids)),
            cache_salt=cache_salt,
            generator=make_generator(params),
            hold=hold,
        )
        self.seqs[rid] = seq
        self.scheduler.add(seq)
        return rid

    def follow_up(
        self, request_id: int, prompt: str | list[int], params: SamplingParams | None = None
    ) -> int:
        """Append a new turn (text or token ids) to a held request that ended, and run it
        again on the cache it kept: nothing already in the cache is recomputed, and what its
        policy evicted stays evicted (a compressed cache answers the next question with what
        it kept). The turn's prompt is the whole sequence so far plus `prompt`; its output,
        metrics and TTFT are the new turn's. Returns the same request id.

        A follow-up that is preempted (a full pool) is recomputed from its tokens like any
        request, which rebuilds the cache from the whole conversation: `metrics.preemptions`
        says so."""
        seq = self.seqs.get(request_id)
        kept = ("stop", "length")
        if seq is None or not seq.hold or not seq.finished or seq.finish_reason not in kept:
            raise CtxlabError(
                f"request {request_id} holds no cache to continue: add it with hold=True and "
                "let it finish (stop or length) before a follow-up."
            )
        if is_chat(prompt):
            raise CtxlabError(
                "a follow-up is text or token ids appended to the conversation; render the "
                "new turn with the chat template's own markers."
            )
        if self.policy is not None and self.policy.prefill_key(1) is not None:
            raise CtxlabError(
                f"policy {self.policy.name!r} masks prefill by position, which a follow-up "
                "over its cut cache cannot do; use its decode-only form for follow-ups."
            )
        params = params or SamplingParams()
        ids = self.encode(prompt)
        if not ids:
            raise CtxlabError("the follow-up is empty; give at least one token of text.")
        total = seq.num_tokens + len(ids)
        if not self.runtime.unbounded_positions:
            self.check_context(total, params.max_tokens)
        seq.prompt_ids = seq.token_ids + ids
        seq.token_ids = list(seq.prompt_ids)
        seq.params = params
        seq.generator = make_generator(params)
        seq.metrics = RequestMetrics(arrival_time=time.perf_counter(), prompt_tokens=total)
        seq.metrics.reused_tokens = seq.num_computed
        seq.text, seq.finish_reason, seq.error, seq.prompt_logprobs = "", None, None, []
        seq.status = Status.WAITING
        self.scheduler.add(seq)
        return request_id

    def release(self, request_id: int) -> None:
        """Free a held request's cache and forget it (a running one is aborted first)."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return
        if not seq.finished:
            self._end(seq, "abort", time.perf_counter())
        elif seq.kv.max_blocks:
            self.kv.free(seq.kv)
        self.runtime.release(request_id)

    def check_context(self, prompt_len: int, max_tokens: int) -> None:
        """Refuse a request whose prompt plus max_tokens exceeds the model's positions, before
        any work: serve answers 400 with this sentence and `generate` exits with it, rather
        than decoding thousands of tokens into the position limit. A policy with unbounded
        positions (streaming) has no such limit."""
        if self.runtime.unbounded_positions or prompt_len + max_tokens <= self.max_position:
            return
        raise CtxlabError(
            f"this model's maximum context length is {self.max_position} tokens, but "
            f"{prompt_len + max_tokens} were requested ({prompt_len} in the prompt, "
            f"{max_tokens} in max_tokens); reduce the prompt or max_tokens."
        )

    def _check_policy_floor(self, prompt_len: int) -> None:
        """Refuse a prompt whose budget (a share of it) falls under what the policy always
        keeps (sinks, observation window): the policy would raise at the end of prefill.

        Asks the policy itself, per layer, as the runtime does: `lane_budget` then
        `check_budget` (PyramidKV's budgets differ by layer).
        """
        from ctxlab.policy.observation import LayerObs

        pol = self.policy
        check = getattr(pol, "check_budget", None) if pol is not None else None
        if check is None:
            return
        cfg = self.config
        empty = torch.empty(cfg.num_kv_heads, 0)
        for layer in range(cfg.num_layers):
            obs = LayerObs(layer, cfg.num_layers, cfg.num_heads, empty, 0, prompt_len)
            try:
                budget = pol.lane_budget(obs)
                if budget is not None:
                    check(budget)
            except CtxlabError as exc:
                raise CtxlabError(
                    f"a prompt of {prompt_len} tokens cannot run under {pol.name} with budget "
                    f"{pol.budget} ({str(exc).rstrip('.')}); give a longer prompt or a larger "
                    "budget."
                ) from None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_preemptions(self) -> int:
        """Preemptions (recompute) since the engine started."""
        return self.scheduler.num_preemptions

    def abort(self, request_id: int) -> RequestOutput | None:
        """Stop a request now: it leaves the scheduler and its blocks go back to the pool.

        Returns its output so far (finish_reason "abort"), or None when the request is
        unknown or already finished. The caller removes it from `seqs` as for any output.
        """
        seq = self.seqs.get(request_id)
        if seq is None or seq.finished:
            return None
        self._end(seq, "abort", time.perf_counter())
        return self.output(request_id)

    def _end(self, seq: Sequence, reason: str, now: float) -> None:
        keep = seq.hold and reason in ("stop", "length")  # held for a follow-up turn
        self.scheduler.finish(seq, reason, keep)
        if not keep:
            self.runtime.release(seq.seq_id)
        seq.metrics.finish_time = now

    # -- the loop -------------------------------------------------------------------------
    def step(self, detokenize: bool = False) -> list[TokenEvent]:
        batch = self.scheduler.schedule()
        if not batch:
            if self.scheduler.has_unfinished():
                raise RuntimeError("the scheduler made no progress")
            return []
        try:
            tokens = self.runner.run(batch)
        except Exception as exc:  # one request's failure must not stop the others
            return self._recover(batch, exc)
        self.scheduler.stepped(batch)
        now = time.perf_counter()
        events: list[TokenEvent] = []
        it = iter(tokens)
        for sch in batch:
            seq = sch.seq
            tok = next(it) if sch.samples else -1
            try:
                seq.num_computed += sch.num_new
                if not sch.samples:
                    continue
                seq.token_ids.append(tok)
                m = seq.metrics
                if m.first_token_time is None:
                    m.first_token_time = now
                m.token_times.append(now)
                m.output_tokens += 1
                events.append(self._after_token(seq, tok, now, detokenize))
            except Exception as exc:  # e.g. detokenizing or a stop string: this request only
                if not seq.finished:
                    events.append(self._fail(seq, exc, now))
        return events

    def _recover(self, batch: list, exc: Exception) -> list[TokenEvent]:
        """A step raised. Every running request is recomputed on a fresh runtime; a step of
        one request fails that request, a step of several makes them suspects that run
        alone until the culprit fails again (`Scheduler.isolate`)."""
        self.num_failed_steps += 1
        self.scheduler.reset_running()
        self._build_runtime()
        if len(batch) > 1:
            log.info("a step of %d requests failed (%s); isolating them", len(batch), exc)
            self.scheduler.isolate([sch.seq for sch in batch])
            return []
        return [self._fail(batch[0].seq, exc, time.perf_counter())]

    def _fail(self, seq: Sequence, exc: Exception, now: float) -> TokenEvent:
        """Finish `seq` with an error (blocks freed); the event the caller hands on."""
        user = isinstance(exc, CtxlabError)
        if not user:
            log.error("request %d failed inside a step", seq.seq_id, exc_info=exc)
        seq.error = RequestError(str(exc) or type(exc).__name__, user)
        self._end(seq, "error", now)
        return TokenEvent(seq.seq_id, -1, "", True, self.output(seq.seq_id))

    def _after_token(self, seq: Sequence, tok: int, now: float, detok: bool) -> TokenEvent:
        p = seq.params
        reason = None
        delta = ""
        if tok in self.eos_ids and not p.ignore_eos:
            reason = "stop"
        elif seq.metrics.output_tokens >= p.max_tokens or (
            seq.num_tokens >= self.max_position and not self.runtime.unbounded_positions
        ):
            reason = "length"
        if self.tokenizer is not None and (detok or p.stop):
            text = self.tokenizer.decode(seq.output_ids)
            if p.stop:
                cut = min((i for s in p.stop if (i := text.find(s)) >= 0), default=-1)
                if cut >= 0:
                    text, reason = text[:cut], "stop"
            if text.endswith("\ufffd") and reason is None:
                return TokenEvent(seq.seq_id, tok, "", False)  # wait for the rest of a char
            delta = text[len(seq.text) :] if text.startswith(seq.text) else text
            seq.text = text
        if reason is None:
            return TokenEvent(seq.seq_id, tok, delta, False)
        self._end(seq, reason, now)
        return TokenEvent(seq.seq_id, tok, delta, True, self.output(seq.seq_id))

    def output(self, rid: int) -> RequestOutput:
        seq = self.seqs[rid]
        text = seq.text
        if self.tokenizer is not None and not seq.params.stop:
            text = self.tokenizer.decode(seq.output_ids)
        return RequestOutput(
            request_id=rid,
            prompt_token_ids=seq.prompt_ids,
            text=text,
            token_ids=seq.output_ids,
            finish_reason=seq.finish_reason or "",
            metrics=seq.metrics,
            prompt_logprobs=seq.prompt_logprobs if seq.params.prompt_logprobs else None,
            error=seq.error,
        )

    def stats(self) -> KVStats:
        return self.kv.stats()

    def run_all(self, rids: list[int]) -> list[RequestOutput]:
        while self.has_unfinished():
            self.step()
        outs = [self.output(r) for r in rids]
        for r in rids:
            if not self._holds(r):  # a held request stays until `release`
                del self.seqs[r]
        return outs

    def _holds(self, request_id: int) -> bool:
        seq = self.seqs.get(request_id)
        return seq is not None and seq.hold and seq.finish_reason in ("stop", "length")


def cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's storage dtype for `kv_cache_dtype` `name` ("auto": the model's)."""
    if name == "auto":
        return model_dtype
    if name == "bfloat16":
        return torch.bfloat16
    known = ", ".join(KV_CACHE_DTYPES)
    raise CtxlabError(f"kv_cache_dtype {name!r} is unknown; use one of {known}.")
