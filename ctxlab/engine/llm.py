"""The batch API: `LLM(...).generate(...)` and `LLM.stream(...)`.

`LLM` loads the model and drives an `LLMEngine` (ctxlab/engine/llm_engine.py) until its
requests finish; a request's shapes live in ctxlab/engine/request.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ctxlab.engine.llm_engine import LLMEngine
from ctxlab.engine.request import RequestFailedError, RequestOutput, TokenEvent, as_prompt_list
from ctxlab.engine.sampling import SamplingParams
from ctxlab.errors import CtxlabError
from ctxlab.kv.manager import KVStats


class LLM:
    """Load a model and run requests through the paged engine.

    `model` is a model name or path understood by `ctxlab.model.load_model`, or an already
    loaded `LoadedModel` (tests share one across several engines). `policy`/`budget` pick a
    KV policy (`ctxlab policies`); `kv_format` ("int8", "kivi4", "kivi2") stores the pool
    quantized under any policy (`policy="quant"` alone: every token kept, quantized);
    `kv_cache_dtype="bfloat16"` stores it in bfloat16 beside a float32 model.
    `weights` stores the linear layers in a format, chosen at load (`ctxlab.model.weights`):
    "fp32" (float32 `F.linear` on MKL; the transformers-parity reference), "fp32-onednn"
    (float32 prepacked for oneDNN), "bf16" (bfloat16: oneDNN's prepacked kernel on a CPU with
    bf16 dot products, `F.linear` elsewhere), "int8" (fbgemm's dynamic int8 linear: int8 weights
    with a scale per row, inputs quantized per token on a rotated residual stream; the fastest
    kernel measured for prefill and batched decode, so the one to pick for speed), "int4"
    (aten's int4 matmul on the GGUF's own Q4_0/Q4_1 codes: the fewest bytes and the fastest
    batch-1 decode, but 2-3x slower than int8 for batches and prefill). Given a `LoadedModel`,
    `weights` must match the format it was loaded with. Measurements and reasons:
    docs/decode.md.
    `rope_scaling` ("linear:F", "dynamic:F", "yarn:F") scales RoPE on a checkpoint that does
    not, and runs it to trained x F positions (`ctxlab.model.rope_override`).
    """

    def __init__(
        self,
        model: Any = "smollm2-135m",
        kv_pool_tokens: int = 32768,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        dtype: str | torch.dtype = "float32",
        max_num_batched_tokens: int = 4096,
        max_num_seqs: int = 64,
        device: str = "cpu",
        policy: Any = None,
        budget: Any = None,
        max_model_len: int | None = None,
        kv_format: str | None = None,
        weights: str = "fp32",
        rope_scaling: str | None = None,
        kv_cache_dtype: str = "auto",
    ):
        if isinstance(model, str):
            from ctxlab.model import load_model

            loaded = load_model(
                model, dtype=dtype, device=device, weights=weights, rope_scaling=rope_scaling
            )
            model_id = model if weights == "fp32" else f"{model}@{weights}"
        else:
            have = getattr(getattr(model, "model", None), "weight_format", "fp32")
            if weights not in ("fp32", have):
                raise CtxlabError(
                    f"this model is already loaded with {have} weights; load it with "
                    f"load_model(..., weights={weights!r}) to run {weights}."
                )
            from ctxlab.model.rope_override import apply_rope_override

            loaded = apply_rope_override(model, rope_scaling)
            model_id = str(getattr(loaded, "source_path", "model"))
            model_id += "" if have == "fp32" else f"@{have}"
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.engine = LLMEngine(
            loaded.model,
            loaded.config,
            loaded.tokenizer,
            kv_pool_tokens=kv_pool_tokens,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            model_id=model_id,
            policy=policy,
            budget=budget,
            max_model_len=max_model_len,
            kv_format=kv_format,
            kv_cache_dtype=kv_cache_dtype,
        )

    def generate(
        self,
        prompts: Any,
        params: SamplingParams | None = None,
        cache_salt: str | None = None,
        hold: bool = False,
    ) -> list[RequestOutput]:
        """Run every prompt to completion (continuous batching); outputs in prompt order.

        A prompt the engine refuses raises before anything runs; a request that fails inside
        a step raises `RequestFailedError` after the others finished (they are in its
        `outputs`). Either way the engine stays usable. With `hold`, each request keeps its
        cache (as its policy left it) for `follow_up` until `release`.
        """
        rids = self._add_all(prompts, params, cache_salt, hold)
        return self._finish(self.engine.run_all(rids))

    def follow_up(
        self,
        request_ids: list[int],
        prompts: list[str] | list[list[int]],
        params: SamplingParams | None = None,
    ) -> list[RequestOutput]:
        """The next turn of held requests, each against the cache it kept (no recompute of
        what is cached, no return of what its policy evicted), run together to completion;
        `prompts[i]` (text or token ids) is appended to request `request_ids[i]`."""
        if len(request_ids) != len(prompts):
            raise CtxlabError(f"{len(request_ids)} request ids for {len(prompts)} follow-ups.")
        if len(set(request_ids)) != len(request_ids):
            raise CtxlabError("a request takes one follow-up at a time; the ids repeat.")
        for rid, prompt in zip(request_ids, prompts, strict=True):
            self.engine.follow_up(rid, prompt, params)
        return self._finish(self.engine.run_all(list(request_ids)))

    def release(self, request_ids: list[int]) -> None:
        """Free the caches of held requests."""
        for rid in request_ids:
            self.engine.release(rid)

    def set_policy(self, policy: Any = None, budget: Any = None) -> None:
        """Another policy for the next requests, on the same pool and prefix cache
        (`LLMEngine.set_policy`)."""
        self.engine.set_policy(policy, budget)

    def _finish(self, outs: list[RequestOutput]) -> list[RequestOutput]:
        failed = [o for o in outs if o.error is not None]
        if failed:
            first = failed[0]
            assert first.error is not None
            raise RequestFailedError(
                f"{len(failed)} of {len(outs)} requests failed; request {first.request_id}: "
                f"{first.error.message}",
                outs,
            )
        return outs

    def _add_all(
        self, prompts: Any, params: SamplingParams | None, salt: str | None, hold: bool = False
    ) -> list[int]:
        """Add every prompt, or none: a refused prompt aborts the ones added before it."""
        rids: list[int] = []
        try:
            for p in as_prompt_list(prompts):
                rids.append(self.engine.add_request(p, params, salt, hold))
        except BaseException:
            for r in rids:
                self.engine.abort(r)
                self.engine.seqs.pop(r, None)
            raise
        return rids

    def stream(
        self,
        prompts: Any,
        params: SamplingParams | None = None,
        cache_salt: str | None = None,
    ) -> Iterator[TokenEvent]:
        """Yield each token as it is produced (all prompts batched together)."""
        rids = self._add_all(prompts, params, cache_salt)
        while self.engine.has_unfinished():
            yield from self.engine.step(detokenize=True)
        for r in rids:
            self.engine.seqs.pop(r, None)

    def stats(self) -> KVStats:
        return self.engine.stats()
