"""Cost: what one request costs on a hosted API and what one successful request costs
self-hosted.

Hosted APIs bill four token streams at different prices: uncached input, tokens written to
the provider's prompt cache, tokens read back from it, and output (`rate_card.py` adds
length tiers, dates and regions on top). Self-hosting bills machine time, and only
successful requests deliver value, so failed or retried work is spread over the successes
(`self_hosted.py` holds every term of that bill).
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxlab.errors import CtxlabError
from ctxlab.plan.units import require_non_negative, require_positive


@dataclass(frozen=True)
class HostedPrices:
    """Prices in currency per `unit` tokens (default: per million tokens)."""

    input: float
    output: float
    cache_write: float | None = None  # None: billed as uncached input
    cache_read: float | None = None  # None: billed as uncached input (no discount)
    unit: int = 1_000_000

    def __post_init__(self) -> None:
        require_positive(self.input, "the input price")
        require_positive(self.output, "the output price")
        if self.cache_write is not None:
            require_positive(self.cache_write, "the cache-write price")
        if self.cache_read is not None:
            require_positive(self.cache_read, "the cache-read price")
        require_positive(self.unit, "the price unit (tokens per price)")

    @property
    def write(self) -> float:
        return self.input if self.cache_write is None else self.cache_write

    @property
    def read(self) -> float:
        return self.input if self.cache_read is None else self.cache_read


@dataclass(frozen=True)
class HostedCost:
    uncached_input: float
    cache_write: float
    cache_read: float
    output: float

    @property
    def total(self) -> float:
        return self.uncached_input + self.cache_write + self.cache_read + self.output


def hosted_cost(
    prices: HostedPrices,
    uncached_tokens: int,
    output_tokens: int,
    cache_write_tokens: int = 0,
    cache_read_tokens: int = 0,
) -> HostedCost:
    """Cost of one request, stream by stream."""
    for value, what in (
        (uncached_tokens, "uncached input tokens"),
        (output_tokens, "output tokens"),
        (cache_write_tokens, "cache-write tokens"),
        (cache_read_tokens, "cache-read tokens"),
    ):
        require_non_negative(value, what)
    per = 1 / prices.unit
    return HostedCost(
        uncached_input=uncached_tokens * prices.input * per,
        cache_write=cache_write_tokens * prices.write * per,
        cache_read=cache_read_tokens * prices.read * per,
        output=output_tokens * prices.output * per,
    )


@dataclass(frozen=True)
class SelfHostedCost:
    gpu_seconds: float
    cpu_seconds: float
    successes: int
    gpu_cost: float
    cpu_cost: float

    @property
    def total(self) -> float:
        return self.gpu_cost + self.cpu_cost

    @property
    def per_success(self) -> float:
        return self.total / self.successes


def self_hosted_cost(
    gpu_seconds: float,
    gpu_hourly: float,
    successes: int = 1,
    cpu_seconds: float = 0.0,
    cpu_hourly: float | None = None,
) -> SelfHostedCost:
    """Machine time priced at hourly rates, divided over the successful requests."""
    require_non_negative(gpu_seconds, "GPU seconds")
    require_positive(gpu_hourly, "the GPU hourly rate")
    require_non_negative(cpu_seconds, "CPU seconds")
    if cpu_hourly is not None:
        require_positive(cpu_hourly, "the CPU hourly rate")
    elif cpu_seconds > 0:
        raise CtxlabError("CPU seconds were given without a CPU hourly rate to price them")
    if successes <= 0:
        raise CtxlabError(f"the number of successful requests must be positive, got {successes}")
    return SelfHostedCost(
        gpu_seconds=gpu_seconds,
        cpu_seconds=cpu_seconds,
        successes=successes,
        gpu_cost=gpu_seconds * gpu_hourly / 3600,
        cpu_cost=cpu_seconds * (cpu_hourly or 0.0) / 3600,
    )


@dataclass(frozen=True)
class SelfHostedRates:
    """Rates and, optionally, what a measured run used and how its requests ended.

    Without `gpu_seconds` the planner prices each context length at its roofline time, every
    request (succeeded, failed or cancelled) at that time. The other terms of the self-hosted
    bill (`ctxlab.plan.self_hosted`) are run totals: network bytes moved, the far tier's
    storage byte-seconds, and the idle reserve (share of provisioned device time held idle).
    """

    gpu_hourly: float
    cpu_hourly: float | None = None
    gpu_seconds: float | None = None
    cpu_seconds: float = 0.0
    successes: int = 1
    failed: int = 0
    cancelled: int = 0
    network_bytes: int = 0
    storage_byte_seconds: float = 0.0
    idle_reserve: float = 0.0
    network_per_gb: float | None = None
    storage_per_gb_month: float | None = None

    def __post_init__(self) -> None:
        require_positive(self.gpu_hourly, "the GPU hourly rate")
        if self.cpu_hourly is not None:
            require_positive(self.cpu_hourly, "the CPU hourly rate")
        if self.gpu_seconds is not None:
            require_non_negative(self.gpu_seconds, "GPU seconds")
        require_non_negative(self.cpu_seconds, "CPU seconds")
        if self.successes <= 0:
            raise CtxlabError(
                f"the number of successful requests must be positive, got {self.successes}"
            )
        require_non_negative(self.failed, "failed requests")
        require_non_negative(self.cancelled, "cancelled requests")
        require_non_negative(self.network_bytes, "network bytes")
        require_non_negative(self.storage_byte_seconds, "storage byte-seconds")
        if not 0 <= self.idle_reserve < 1:
            raise CtxlabError(
                "the idle reserve is a share of provisioned device time, 0 <= r < 1, got "
                f"{self.idle_reserve}"
            )
