"""llama.cpp's server KV cache, from its documentation and source as remembered, not measured.

llama.cpp does not size its cache from free memory: `llama-server -c N_CTX -np SLOTS`
allocates the cache for `N_CTX` tokens up front and gives each slot `N_CTX / SLOTS` of
them (src/llama-context.cpp, src/llama-kv-cache.cpp, tools/server/README.md):

1. `n_ctx` is padded up to a multiple of 256 cells (uncertain: older builds padded to 32).
2. Every non-sliding layer holds `n_ctx` cells of K and V (`n_embd_k_gqa + n_embd_v_gqa`
   elements, the `-ctk/-ctv` type, f16 by default).
3. Sliding-window models get a second cache (src/llama-kv-cache-iswa.cpp): each slot's
   stream holds `min(n_ctx_seq, pad(n_swa + n_ubatch, 256))` cells in the sliding layers
   (`n_ubatch` 512 by default); `--swa-full` gives them the full size instead.
4. Concurrency is the slot count; each slot holds `n_ctx / slots` tokens. The planner
   asks for `max_model_len x slots` so every slot holds a request of `max_model_len`.

Uncertain: the padding (256) and the non-unified per-slot streams (the default without
`--kv-unified`) are as remembered from 2025 builds; nothing here was measured.
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
)

VERSION = "llama.cpp server (2025 builds; documented rules, not measured here)"
CTX_PAD = 256
N_UBATCH = 512
RULES: tuple[tuple[str, str], ...] = (
    (
        "n_ctx = pad(max_model_len x slots, 256); each slot holds n_ctx / slots tokens",
        "src/llama-context.cpp; tools/server/README.md (-c, -np)",
    ),
    (
        "full layers: n_ctx cells of K and V per layer",
        "src/llama-kv-cache.cpp: llama_kv_cache",
    ),
    (
        "sliding layers: min(n_ctx per slot, pad(n_swa + n_ubatch (512), 256)) cells per "
        "slot; --swa-full gives them n_ctx",
        "src/llama-kv-cache-iswa.cpp: llama_kv_cache_iswa",
    ),
)


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def predict(spec: ArchSpec, settings: EngineSettings) -> EnginePool:
    """The cache llama-server allocates for `slots` slots of `max_model_len` tokens."""
    check_growing_layers(spec, "llama.cpp", ("full", "sliding", "mla"))
    rank = spec.per_rank(settings.tp)
    dtype = rank.cache_dtype_bytes
    mml, slots = settings.max_model_len, settings.slots
    n_ctx = _pad(mml * slots, CTX_PAD)
    per_slot = n_ctx // slots
    groups = []
    allocated = 0
    full = [i for i, layer in enumerate(rank.layers) if layer.kind in ("full", "mla")]
    swa = [i for i, layer in enumerate(rank.layers) if layer.kind == "sliding"]
    if full:
        per_token = sum(rank.layers[i].bytes_per_token(dtype) for i in full)
        allocated += n_ctx * per_token
        groups.append(
            PoolGroup(
                kind="full cache",
                layers=tuple(full),
                block_size=1,
                block_bytes=per_token,
                blocks_per_request=per_slot,
                rule=f"n_ctx {n_ctx:,} / {slots} slot{'s' if slots > 1 else ''}",
            )
        )
    if swa:
        window = max(rank.layers[i].window or 0 for i in swa)
        swa_cells = min(per_slot, _pad(window + N_UBATCH, CTX_PAD))
        per_token = sum(rank.layers[i].bytes_per_token(dtype) for i in swa)
        allocated += swa_cells * slots * per_token
        groups.append(
            PoolGroup(
                kind=f"sliding cache (window={window})",
                layers=tuple(swa),
                block_size=1,
                block_bytes=per_token,
                blocks_per_request=swa_cells,
                rule=f"min({per_slot:,}, pad({window} + {N_UBATCH}, {CTX_PAD}))",
            )
        )
    refusal = None
    budget = settings.kv_cache_bytes
    if budget is not None and allocated > budget:
        refusal = (
            f"llama.cpp would allocate {allocated:,} bytes of KV cache for {slots} slot"
            f"{'s' if slots > 1 else ''} of {mml:,} tokens, more than the {budget:,} given"
        )
    return EnginePool(
        engine="llamacpp",
        version=VERSION,
        basis=FROM_DOCS,
        settings=replace(settings, block_size=1),
        pool_bytes=allocated,
        pool_source=f"allocated for -c {n_ctx:,} -np {slots} (not sized from free memory)",
        block_size=1,
        bytes_per_block=None,
        num_blocks=None,
        groups=tuple(groups),
        bytes_per_request=allocated // slots,
        max_concurrency=float(slots),
        kv_cache_tokens=n_ctx,
        ideal_bytes_per_request=ideal_bytes_per_request(spec, mml, settings.tp),
        rules=RULES,
        log_line=f"llama_context: n_ctx = {n_ctx}, n_ctx_per_seq = {per_slot}",
        refusal=refusal,
        notes=(
            "llama.cpp's rules are from its documentation and source as remembered, not "
            "measured here; --swa-full and --kv-unified change the sliding cache",
        ),
    )
