"""The self-hosted bill: what one successful request costs, with every term of the storage
seed's formula.

    cost per success = ( device seconds x device rate
                       + CPU seconds x CPU rate
                       + network bytes x network rate
                       + storage byte-seconds x storage rate
                       + idle reserve: device seconds held idle for headroom x device rate )
                       / successful requests

The numerator is what the machines did for every request, the failed and cancelled ones
included: their device seconds, transfers and stored bytes were spent and answered nothing.
So failures raise the cost per success while the cost per token processed (the same
numerator over every token every request processed) stays where it was: the machine's work
did not get dearer, fewer answers came out of it.

Network bytes are KV bytes moved between processes or tiers (disaggregation's page
transfers, an offload tier's stores and loads: the engine's `kv_transfer_bytes`,
`kv_offload_store_bytes`, `kv_offload_load_bytes`); storage byte-seconds are the offload
tier's resident bytes integrated over the time they are held. GB is decimal (10^9 bytes), a
month 730 hours, as cloud price lists bill them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxlab.errors import CtxlabError
from ctxlab.plan.units import require_non_negative

GB = 10**9
MONTH_SECONDS = 730 * 3600  # the 730-hour month cloud price lists prorate by


@dataclass(frozen=True)
class SelfHostedPrices:
    """Rates in one currency. None: not priced (a non-zero term without its rate is refused);
    0: priced, and free (KV moved inside one machine)."""

    device_hourly: float | None = None  # one hour of the devices serving (all of them)
    cpu_hourly: float | None = None  # one hour of CPU time
    network_per_gb: float | None = None  # per decimal GB moved
    storage_per_gb_month: float | None = None  # per decimal GB held for 730 hours

    def __post_init__(self) -> None:
        for value, what in (
            (self.device_hourly, "the device hourly rate"),
            (self.cpu_hourly, "the CPU hourly rate"),
            (self.network_per_gb, "the network price per GB"),
            (self.storage_per_gb_month, "the storage price per GB-month"),
        ):
            if value is not None:
                require_non_negative(value, what)


@dataclass(frozen=True)
class Usage:
    """What a run used, measured or planned, and how its requests ended."""

    device_seconds: float
    succeeded: int
    failed: int = 0  # ended in an error after using the machine
    cancelled: int = 0  # aborted by the client (a disconnect, a timeout) after using it
    cpu_seconds: float = 0.0
    network_bytes: int = 0
    storage_byte_seconds: float = 0.0
    idle_reserve: float = 0.0  # share of provisioned device time kept idle, 0 <= r < 1
    tokens: int = 0  # tokens every request processed (prompt + output), failed ones too

    def __post_init__(self) -> None:
        require_non_negative(self.device_seconds, "device seconds")
        require_non_negative(self.cpu_seconds, "CPU seconds")
        require_non_negative(self.network_bytes, "network bytes")
        require_non_negative(self.storage_byte_seconds, "storage byte-seconds")
        require_non_negative(self.failed, "failed requests")
        require_non_negative(self.cancelled, "cancelled requests")
        require_non_negative(self.tokens, "tokens processed")
        if self.succeeded <= 0:
            raise CtxlabError(
                f"the number of successful requests must be positive, got {self.succeeded}; "
                "a run with no success has no cost per success"
            )
        if not 0 <= self.idle_reserve < 1:
            raise CtxlabError(
                f"the idle reserve is a share of provisioned device time, 0 <= r < 1, got "
                f"{self.idle_reserve}"
            )

    @property
    def requests(self) -> int:
        return self.succeeded + self.failed + self.cancelled

    @property
    def idle_device_seconds(self) -> float:
        """Busy seconds are 1 - r of what is provisioned; the rest, r, waits for bursts."""
        return self.device_seconds * self.idle_reserve / (1 - self.idle_reserve)


@dataclass(frozen=True)
class SelfHostedBill:
    """Each term of the formula in currency, and the three ways to divide their sum."""

    usage: Usage
    device: float
    cpu: float
    network: float
    storage: float
    idle_reserve: float

    @property
    def total(self) -> float:
        return self.device + self.cpu + self.network + self.storage + self.idle_reserve

    @property
    def per_success(self) -> float:
        return self.total / self.usage.succeeded

    @property
    def per_request(self) -> float:
        return self.total / self.usage.requests

    @property
    def per_token(self) -> float | None:
        """Per token processed by any request; None when no tokens were counted."""
        return self.total / self.usage.tokens if self.usage.tokens else None

    def terms(self) -> dict[str, float]:
        return {
            "device": self.device,
            "cpu": self.cpu,
            "network": self.network,
            "storage": self.storage,
            "idle_reserve": self.idle_reserve,
        }


def _priced(amount: float, rate: float | None, per: float, what: str, key: str) -> float:
    if amount == 0:
        return 0.0
    if rate is None:
        raise CtxlabError(f"{what} were given without a price for them ({key})")
    return amount * rate / per


def self_hosted_bill(usage: Usage, prices: SelfHostedPrices) -> SelfHostedBill:
    """Price every term of `usage`; a non-zero term without its rate is one sentence."""
    device_hour = prices.device_hourly
    return SelfHostedBill(
        usage=usage,
        device=_priced(usage.device_seconds, device_hour, 3600, "device seconds", "device hourly"),
        cpu=_priced(usage.cpu_seconds, prices.cpu_hourly, 3600, "CPU seconds", "CPU hourly"),
        network=_priced(
            usage.network_bytes, prices.network_per_gb, GB, "network bytes", "network_per_gb"
        ),
        storage=_priced(
            usage.storage_byte_seconds,
            prices.storage_per_gb_month,
            GB * MONTH_SECONDS,
            "storage byte-seconds",
            "storage_per_gb_month",
        ),
        idle_reserve=_priced(
            usage.idle_device_seconds, device_hour, 3600, "an idle reserve", "device hourly"
        ),
    )
