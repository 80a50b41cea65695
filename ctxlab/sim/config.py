"""Everything a simulation run is configured with, and the pool sizing arithmetic.

The pool is what the device leaves for the KV cache: device memory (x gpus) minus the
weights minus a runtime reserve (activations, CUDA graphs, fragmentation; 10% of device
memory by default, like vLLM's 0.9 memory utilisation), unless `pool_bytes` is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError
from ctxlab.plan.capacity import gpus_for_weights, no_room
from ctxlab.plan.devices import Device
from ctxlab.sim.steptime import ArchCost

DEFAULT_RESERVE_FRACTION = 0.10


@dataclass(frozen=True)
class SimConfig:
    """Scheduler, pool and tier options (times in seconds, sizes in bytes)."""

    page_size: int = 16
    chunk_tokens: int = 2048
    max_running: int = 256
    pool_bytes: int | None = None  # None: derived from the device; see `unlimited`
    unlimited: bool = False
    weights_bytes: int | None = None  # None: the architecture's weight bytes
    reserve_bytes: int | None = None  # None: 10% of device memory
    gpus: int = 1
    offload_bytes: int = 0
    offload_bandwidth: float = 25e9  # bytes/s; PCIe 4.0 x16 moves about 25 GB/s
    offload_latency: float = 0.0  # seconds each restore costs before its bytes move
    disaggregated: bool = False
    prefill_gpus: int = 1  # in disaggregated mode: the prefill instance's GPUs
    kv_transfer_bandwidth: float = 50e9  # bytes/s between prefill and decode instances
    slo_ttft: float = 2.0
    slo_tpot: float = 0.1
    compute_efficiency: float = 0.5
    memory_efficiency: float = 0.8
    step_overhead: float = 0.0005
    profile: str | None = None
    step_scale: float = 1.0  # every step's time x this: the prediction's sensitivity to price
    time_scale: float = 1.0  # every arrival time x this (0.5: the trace offered twice as fast)

    def __post_init__(self) -> None:
        positive = {
            "page size": self.page_size,
            "chunk token budget": self.chunk_tokens,
            "max running requests": self.max_running,
            "gpus": self.gpus,
            "prefill gpus": self.prefill_gpus,
            "offload bandwidth": self.offload_bandwidth,
            "KV transfer bandwidth": self.kv_transfer_bandwidth,
            "TTFT SLO": self.slo_ttft,
            "TPOT SLO": self.slo_tpot,
            "step-time scale": self.step_scale,
            "trace time scale": self.time_scale,
        }
        for what, value in positive.items():
            if not (0 < value < math.inf):  # NaN fails too
                raise CtxlabError(f"the {what} must be a positive number, got {value}")
        for what, value in (("pool", self.pool_bytes), ("offload tier", self.offload_bytes)):
            if value is not None and value < 0:
                raise CtxlabError(f"the {what} size must be non-negative, got {value}")
        for what, value in (
            ("compute efficiency", self.compute_efficiency),
            ("memory efficiency", self.memory_efficiency),
        ):
            if not 0 < value <= 1:
                raise CtxlabError(f"the {what} must be in (0, 1], got {value}")
        if not 0 <= self.offload_latency < math.inf:
            raise CtxlabError(
                f"the offload latency must be zero or positive, got {self.offload_latency}"
            )
        if not 0 <= self.step_overhead < math.inf:
            raise CtxlabError(
                f"the step overhead must be zero or positive, got {self.step_overhead}"
            )
        if self.unlimited and self.pool_bytes is not None:
            raise CtxlabError("give either --pool-bytes or --unlimited-cache, not both")

    def with_(self, **changes: object) -> SimConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Setup:
    """A configuration resolved against an architecture and a device."""

    arch: ArchSpec
    device: Device
    config: SimConfig
    cost: ArchCost
    weights_bytes: int
    pool_bytes: int | None  # None = unlimited
    page_bytes: int

    @property
    def pool_pages(self) -> int | None:
        if self.pool_bytes is None or self.page_bytes == 0:
            return None
        return self.pool_bytes // self.page_bytes


def fewest_gpus(arch: ArchSpec, device: Device, config: SimConfig) -> int:
    """The fewest devices that hold the weights plus the reserve."""
    weights = config.weights_bytes if config.weights_bytes is not None else arch.weight_bytes
    need = gpus_for_weights(
        device.memory_bytes, weights, config.reserve_bytes, DEFAULT_RESERVE_FRACTION
    )
    if need is None:
        raise no_room(arch.name, weights, "", 0, 1, device.name, device.memory_bytes, None)
    return need


def resolve(arch: ArchSpec, device: Device, config: SimConfig, gpus: int | None = None) -> Setup:
    """Size the pool; an impossible one (weights do not fit) is one sentence."""
    gpus = config.gpus if gpus is None else gpus
    weights = config.weights_bytes if config.weights_bytes is not None else arch.weight_bytes
    cost = ArchCost.build(arch, weights, gpus)
    page_bytes = config.page_size * cost.kv_bytes_per_token
    if config.unlimited:
        pool: int | None = None
    elif config.pool_bytes is not None:
        pool = config.pool_bytes
    else:
        memory = device.memory_bytes * gpus
        reserve = (
            config.reserve_bytes
            if config.reserve_bytes is not None
            else int(memory * DEFAULT_RESERVE_FRACTION)
        )
        pool = memory - weights - reserve
        if pool <= 0:
            need = gpus_for_weights(
                device.memory_bytes, weights, config.reserve_bytes, DEFAULT_RESERVE_FRACTION
            )
            label = ", given" if config.weights_bytes is not None else f", {arch.weight_format}"
            raise no_room(
                arch.name, weights, label, reserve, gpus, device.name, device.memory_bytes, need
            )
    return Setup(arch, device, config, cost, weights, pool, page_bytes)
