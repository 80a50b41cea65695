"""What an engine allocates for a KV cache, beside what the model ideally needs.

`EngineSettings` is what a deployment is started with (the flags a user passes); `EnginePool`
is the engine's own accounting at start-up: its KV cache groups, the page of each, the blocks
it reserves per request, the blocks in the pool, the maximum concurrency it reports. The
ideal figure (logical bytes of one request at `max_model_len`, no pages, no reservations)
stays beside it; the difference is the engine's allocation overhead, in bytes (storage) and
in requests that no longer fit at once (product).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError

Platform = Literal["gpu", "cpu"]
PLATFORMS: tuple[str, ...] = ("gpu", "cpu")
FROM_SOURCE = "from the engine's source"
FROM_DOCS = "from the engine's documentation, not measured here"


@dataclass(frozen=True)
class EngineSettings:
    """How a deployment is started; None means the engine's own default.

    Byte figures are per tensor-parallel rank except `weights_bytes` (the whole model,
    split over the ranks). `kv_cache_bytes` is the pool itself (vLLM's
    `--kv-cache-memory-bytes`, `VLLM_CPU_KVCACHE_SPACE` in GiB); without it the pool is
    derived from `device_memory_bytes` x `memory_utilization` minus weights and the
    profiled `activation_bytes` (activation peak, CUDA context and graphs, NCCL)."""

    max_model_len: int
    kv_cache_bytes: int | None = None
    device_memory_bytes: int | None = None
    memory_utilization: float | None = None
    weights_bytes: int = 0
    activation_bytes: int = 0
    platform: Platform = "gpu"
    tp: int = 1
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    slots: int = 1
    disable_hybrid: bool = False

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise CtxlabError(
                f"unknown platform {self.platform!r}; known platforms: {', '.join(PLATFORMS)}"
            )
        for value, what in (
            (self.max_model_len, "max model length"),
            (self.tp, "tensor-parallel size"),
            (self.slots, "number of slots"),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CtxlabError(f"the {what} must be a positive whole number, got {value!r}")
        for opt, what in (
            (self.block_size, "block size"),
            (self.max_num_batched_tokens, "max number of batched tokens"),
            (self.kv_cache_bytes, "KV cache size"),
            (self.device_memory_bytes, "device memory"),
        ):
            if opt is not None and opt <= 0:
                raise CtxlabError(f"the {what} must be positive, got {opt}")
        if self.weights_bytes < 0 or self.activation_bytes < 0:
            raise CtxlabError("weights and activation bytes must be zero or positive")
        util = self.memory_utilization
        if util is not None and not 0 < util <= 1:
            raise CtxlabError(f"the memory utilization must be in (0, 1], got {util}")


@dataclass(frozen=True)
class PoolGroup:
    """One KV cache group: layers that share a block table, and what a request reserves."""

    kind: str
    layers: tuple[int, ...]
    block_size: int
    block_bytes: int  # one block of this group: its layers' pages of block_size tokens
    blocks_per_request: int
    rule: str

    @property
    def reserved_tokens(self) -> int:
        return self.blocks_per_request * self.block_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "layers": list(self.layers),
            "block_size": self.block_size,
            "block_bytes": self.block_bytes,
            "blocks_per_request": self.blocks_per_request,
            "reserved_tokens_per_request": self.reserved_tokens,
            "rule": self.rule,
        }


@dataclass(frozen=True)
class EnginePool:
    """The engine's KV pool for one deployment, with the ideal figure beside it.

    `pool_bytes` is what the engine has for KV on one rank; `bytes_per_request` is what one
    request of `max_model_len` tokens takes from it in the engine's accounting;
    `max_concurrency` is the figure the engine itself reports (a fraction)."""

    engine: str
    version: str
    basis: str
    settings: EngineSettings
    pool_bytes: int
    pool_source: str
    block_size: int
    bytes_per_block: int | None
    num_blocks: int | None
    groups: tuple[PoolGroup, ...]
    bytes_per_request: int
    max_concurrency: float
    kv_cache_tokens: int
    ideal_bytes_per_request: int
    rules: tuple[tuple[str, str], ...]
    log_line: str
    refusal: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def blocks_per_request(self) -> int:
        return sum(g.blocks_per_request for g in self.groups)

    @property
    def ideal_concurrency(self) -> float:
        if self.ideal_bytes_per_request <= 0:
            return float("inf")
        return self.pool_bytes / self.ideal_bytes_per_request

    @property
    def requests(self) -> int:
        """Whole requests of `max_model_len` tokens the engine runs at once."""
        return 0 if self.refusal else int(self.max_concurrency)

    @property
    def ideal_requests(self) -> int | None:
        ideal = self.ideal_concurrency
        return None if ideal == float("inf") else int(ideal)

    @property
    def overhead_bytes_per_request(self) -> int:
        return self.bytes_per_request - self.ideal_bytes_per_request

    @property
    def requests_lost(self) -> int | None:
        ideal = self.ideal_requests
        return None if ideal is None else ideal - self.requests

    @property
    def unused_pool_bytes(self) -> int:
        """Pool bytes left over after whole blocks (0 where the engine has no blocks)."""
        if self.num_blocks is None or self.bytes_per_block is None:
            return 0
        return self.pool_bytes - self.num_blocks * self.bytes_per_block

    def to_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "engine": self.engine,
            "version": self.version,
            "basis": self.basis,
            "platform": s.platform,
            "tensor_parallel": s.tp,
            "max_model_len": s.max_model_len,
            "block_size": self.block_size,
            "pool_bytes": self.pool_bytes,
            "pool_source": self.pool_source,
            "bytes_per_block": self.bytes_per_block,
            "num_blocks": self.num_blocks,
            "groups": [g.to_dict() for g in self.groups],
            "blocks_per_request": self.blocks_per_request,
            "bytes_per_request": self.bytes_per_request,
            "max_concurrency": self.max_concurrency,
            "kv_cache_tokens": self.kv_cache_tokens,
            "requests": self.requests,
            "ideal_bytes_per_request": self.ideal_bytes_per_request,
            "ideal_concurrency": (None if self.ideal_requests is None else self.ideal_concurrency),
            "ideal_requests": self.ideal_requests,
            "overhead_bytes_per_request": self.overhead_bytes_per_request,
            "requests_lost": self.requests_lost,
            "unused_pool_bytes": self.unused_pool_bytes,
            "starts": self.refusal is None,
            "refusal": self.refusal,
            "log_line": self.log_line,
            "rules": [{"rule": r, "source": src} for r, src in self.rules],
            "notes": list(self.notes),
        }


def ideal_bytes_per_request(spec: ArchSpec, max_model_len: int, tp: int) -> int:
    """Logical bytes one request of `max_model_len` tokens holds on one rank: no pages,
    sliding layers at their window, nothing reserved for tokens in flight."""
    return spec.per_rank(tp).request_bytes(max_model_len)


def check_growing_layers(spec: ArchSpec, engine: str, kinds: tuple[str, ...]) -> None:
    """One sentence for a layer kind this engine model does not cover."""
    for layer in spec.layers:
        if layer.kind not in kinds and layer.kind != "none":
            raise CtxlabError(
                f"{engine}'s allocation of {layer.label()} layers is not modeled by the planner "
                f"({spec.name} has them); it covers {', '.join(kinds)} layers"
            )


def pool_from_memory(
    settings: EngineSettings, default_utilization: float, engine: str
) -> tuple[int, str]:
    """(pool bytes per rank, where that figure comes from) for a GPU-style budget:
    the pool as given, or device x utilization - weights / tp - activation."""
    if settings.kv_cache_bytes is not None:
        return settings.kv_cache_bytes, "given (--kv-cache-bytes)"
    if settings.device_memory_bytes is None:
        raise CtxlabError(
            f"{engine} needs the KV cache size (--kv-cache-bytes) or the device memory to "
            "derive it from"
        )
    util = settings.memory_utilization or default_utilization
    requested = math.ceil(settings.device_memory_bytes * util)  # as vLLM's request_memory
    weights = -(-settings.weights_bytes // settings.tp)
    pool = requested - weights - settings.activation_bytes
    if pool <= 0:
        raise CtxlabError(
            f"{engine} would have no KV cache: {util:g} of the device memory minus the weights "
            "per rank and the activation reserve leaves nothing; raise the memory utilization "
            "or use more GPUs"
        )
    source = (
        f"device memory x {util:g} - weights / {settings.tp} - activation reserve "
        f"({settings.activation_bytes:,} bytes)"
    )
    return pool, source
