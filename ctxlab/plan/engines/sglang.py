"""SGLang's KV token pool, from its documentation and source as remembered, not measured here.

SGLang sizes a pool of token slots, not of multi-layer blocks (`ModelRunner.
profile_max_num_token` in python/sglang/srt/model_executor/model_runner.py):

1. cell size = bytes one token costs over all layers on one rank: `kv_heads_per_rank x
   head_dim x layers x 2 x dtype` (MLA: `(kv_lora_rank + qk_rope_head_dim) x layers x
   dtype`).
2. pool = device memory x `mem_fraction_static` - what is in use after loading (weights,
   CUDA context); `max_total_num_tokens = pool // cell size`, rounded down to a multiple of
   `page_size` (default 1).
3. Sliding-window models (Gemma 3, gpt-oss) get two pools (`SWAKVPool`): the token total
   `max_total_num_tokens x layers` is split so the sliding pool holds `swa_full_tokens_ratio`
   (default 0.8) times the full pool's tokens: `full = total / (ratio x sliding_layers +
   full_layers)`, `sliding = full x ratio`.
4. A request holds its length (rounded to pages) in the full pool and up to its window in
   the sliding pool, so the smaller of the two quotients bounds concurrency.

Uncertain: `mem_fraction_static` is chosen by SGLang from the GPU's memory and the TP size
(its log prints it; pass it as --gpu-memory-utilization); a sliding request's transient
hold during chunked prefill (window plus one chunk) is not modeled.
"""

from __future__ import annotations

from dataclasses import replace

from ctxlab.arch.spec import ArchSpec
from ctxlab.plan.engines.pool import (
    FROM_DOCS,
    EnginePool,
    EngineSettings,
    PoolGroup,
    check_growing_layers,
    ideal_bytes_per_request,
    pool_from_memory,
)

VERSION = "SGLang 0.5 (documented rules; not measured here)"
DEFAULT_MEM_FRACTION = 0.88  # uncertain: SGLang picks it from GPU memory and TP size
DEFAULT_PAGE_SIZE = 1
SWA_FULL_TOKENS_RATIO = 0.8
_SRC = "python/sglang/srt/model_executor/model_runner.py"
RULES: tuple[tuple[str, str], ...] = (
    (
        "cell = KV heads per rank x head_dim x layers x 2 x dtype (MLA: latent + rope, no 2)",
        f"{_SRC}: profile_max_num_token",
    ),
    (
        "max_total_num_tokens = (device x mem_fraction_static - used after loading) // cell, "
        "rounded down to page_size (default 1)",
        f"{_SRC}: profile_max_num_token, init_memory_pool",
    ),
    (
        "sliding-window models: full = tokens x layers / (swa_full_tokens_ratio (0.8) x "
        "sliding layers + full layers); sliding = full x ratio",
        f"{_SRC}: set_num_token_hybrid; python/sglang/srt/mem_cache/memory_pool.py: SWAKVPool",
    ),
)


def predict(spec: ArchSpec, settings: EngineSettings) -> EnginePool:
    """SGLang's token pools for `spec` and the requests of `max_model_len` they hold."""
    check_growing_layers(spec, "SGLang", ("full", "sliding", "mla"))
    rank = spec.per_rank(settings.tp)
    dtype = rank.cache_dtype_bytes
    page = settings.block_size or DEFAULT_PAGE_SIZE
    pool, source = pool_from_memory(settings, DEFAULT_MEM_FRACTION, "SGLang")
    mml = settings.max_model_len
    cells = [layer.bytes_per_token(dtype) for layer in rank.layers if layer.grows_with_context]
    full_layers = [i for i, layer in enumerate(rank.layers) if layer.kind in ("full", "mla")]
    swa_layers = [i for i, layer in enumerate(rank.layers) if layer.kind == "sliding"]
    cell = sum(cells)
    tokens = pool // cell // page * page
    pages_per_request = -(-mml // page)
    notes = [
        "SGLang's rules are from its documentation and source as remembered, not measured "
        "here; mem_fraction_static is chosen by SGLang per GPU (its log prints it)"
    ]
    if not swa_layers or not full_layers:
        # One pool; a model whose every layer slides is not a hybrid SWA model to SGLang
        # (uncertain), so its requests hold every token.
        groups = (
            PoolGroup(
                kind="token pool",
                layers=tuple(full_layers or swa_layers),
                block_size=page,
                block_bytes=cell * page,
                blocks_per_request=pages_per_request,
                rule=f"ceil({mml:,} / page {page})",
            ),
        )
        concurrency = tokens / (pages_per_request * page)
        log = f"KV Cache is allocated. #tokens: {tokens:,}"
    else:
        n_layers = len(cells)
        per_layer = cell // n_layers
        total = tokens * n_layers
        full_tokens = int(total / (SWA_FULL_TOKENS_RATIO * len(swa_layers) + len(full_layers)))
        swa_tokens = int(full_tokens * SWA_FULL_TOKENS_RATIO)
        window = _window(spec)
        swa_pages = -(-min(mml, window) // page)
        groups = (
            PoolGroup(
                kind="full pool",
                layers=tuple(full_layers),
                block_size=page,
                block_bytes=per_layer * len(full_layers) * page,
                blocks_per_request=pages_per_request,
                rule=f"ceil({mml:,} / page {page}); pool {full_tokens:,} tokens",
            ),
            PoolGroup(
                kind=f"sliding pool (window={window})",
                layers=tuple(swa_layers),
                block_size=page,
                block_bytes=per_layer * len(swa_layers) * page,
                blocks_per_request=swa_pages,
                rule=f"ceil(min({mml:,}, {window}) / page {page}); pool {swa_tokens:,} tokens",
            ),
        )
        concurrency = min(full_tokens / (pages_per_request * page), swa_tokens / (swa_pages * page))
        tokens = full_tokens
        log = f"max_total_num_tokens={full_tokens:,} (full), {swa_tokens:,} (sliding)"
        notes.append(
            f"sliding pool holds {SWA_FULL_TOKENS_RATIO:g} x the full pool's tokens "
            "(--swa-full-tokens-ratio); a request's transient hold during chunked prefill "
            "is not modeled"
        )
    per_request = int(pool / concurrency) if concurrency > 0 else pool
    refusal = None
    if concurrency < 1:
        refusal = f"SGLang's pool ({tokens:,} tokens) cannot hold one request of {mml:,} tokens"
    return EnginePool(
        engine="sglang",
        version=VERSION,
        basis=FROM_DOCS,
        settings=replace(settings, block_size=page),
        pool_bytes=pool,
        pool_source=source,
        block_size=page,
        bytes_per_block=None,
        num_blocks=None,
        groups=groups,
        bytes_per_request=per_request,
        max_concurrency=concurrency,
        kv_cache_tokens=tokens,
        ideal_bytes_per_request=ideal_bytes_per_request(spec, mml, settings.tp),
        rules=RULES,
        log_line=log,
        refusal=refusal,
        notes=tuple(notes),
    )


def _window(spec: ArchSpec) -> int:
    return max((layer.window or 0) for layer in spec.layers if layer.kind == "sliding")
