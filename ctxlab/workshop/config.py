"""The experiment contract's shared schema: the tables every demonstration reads.

Strict types (TOML's own: no string is read as a number), no unknown keys, and checks of
values that cannot work: a page size of 0, a divergence past the prompt, a pool that cannot
hold the running requests, a prediction for a metric the demonstration does not report.
Each demonstration declares its own table (`Demonstration.section`); the whole contract,
`registry.WorkshopConfig`, is these shared tables plus one table per registered
demonstration. Reading a file, merging it over the default and turning an error into one sentence is
`config_file.load_config`. Nothing here imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ctxlab.arch.limits import MAX_COUNT, MAX_TOKENS
from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError
from ctxlab.inputs import SEED_MAX, check_threads
from ctxlab.workshop.config_servers import ServerList

if TYPE_CHECKING:
    from ctxlab.plan.rate_card import RateCard
    from ctxlab.plan.self_hosted import SelfHostedPrices

Pos = Annotated[int, Field(ge=1)]
NonNeg = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]
MAX_FLOAT = 1e9  # prices, rates, seconds, GiB: past this a value is a typo (1e9 s is 31 years)


def arch_from(source: str) -> ArchSpec:
    """An architecture from a preset name, a Hugging Face config.json or a GGUF file (its
    header only); what cannot be read raises ValueError with the reason."""
    from ctxlab.arch import resolve_arch
    from ctxlab.arch.presets import PRESETS
    from ctxlab.errors import CtxlabError

    try:
        if source.endswith(".gguf"):
            return resolve_arch(gguf=source)
        if source.endswith(".json"):
            return resolve_arch(config=source)
        if source not in PRESETS:
            raise ValueError(
                f"{source!r} is not a preset (known: {', '.join(PRESETS)}), a .gguf file or a "
                "config.json"
            )
        return resolve_arch(name=source)
    except CtxlabError as exc:
        raise ValueError(str(exc).rstrip(".")) from None


class Section(BaseModel):
    """The base of every config table: strict TOML types, no unknown keys, frozen."""

    # allow_inf_nan: every number of the contract is finite (TOML's inf would pass gt=0).
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _finite_but_absurd(self) -> Section:
        """A number with no upper bound of its own (a count, a size, a price, a duration) is
        at most MAX_COUNT (2**30) when whole and MAX_FLOAT (1e9) otherwise, for every table,
        so 10^12 repeats or a 1e300 s wait is one sentence before the model loads, not a
        run that never ends or overflows."""
        for name, info in type(self).model_fields.items():
            if any(hasattr(m, "le") or hasattr(m, "lt") for m in info.metadata):
                continue  # the field's own bound (page sizes, seeds, shares) already holds
            value = getattr(self, name)
            for item in value if isinstance(value, list | tuple) else (value,):
                if isinstance(item, bool) or not isinstance(item, int | float):
                    continue
                limit = MAX_COUNT if isinstance(item, int) else MAX_FLOAT
                if abs(item) > limit:
                    shown = f"{item:,}" if isinstance(item, int) else f"{item:g}"
                    bound = "2**30" if isinstance(item, int) else "1e9"
                    raise ValueError(
                        f"{name} = {shown} is past {bound}, the most any number of the "
                        "contract may be (no machine runs that much)"
                    )
        return self


class ModelSection(Section):
    source: str = Field(min_length=1)
    arch: str
    dtype: Literal["float32", "bfloat16"]
    threads: NonNeg
    max_model_len: Annotated[int, Field(ge=16)]
    reserved_output_tokens: Pos
    seed: Seed

    @field_validator("threads")
    @classmethod
    def _threads(cls, value: int) -> int:
        try:
            return check_threads(value, "threads", allow_zero=True)
        except CtxlabError as exc:
            raise ValueError(str(exc).rstrip(".")) from None

    @field_validator("arch")
    @classmethod
    def _arch(cls, name: str) -> str:
        if name:
            arch_from(name)
        return name

    @model_validator(mode="after")
    def _budget(self) -> ModelSection:
        if self.reserved_output_tokens >= self.max_model_len:
            raise ValueError(
                f"reserved_output_tokens {self.reserved_output_tokens} leaves no prompt budget "
                f"in max_model_len {self.max_model_len}"
            )
        return self


class EngineSection(Section):
    # Tokens: at most MAX_TOKENS (2**30), whose pool no machine holds anyway; whether this
    # machine holds the pool is checked when it is allocated (`kv.manager`, one sentence).
    page_size: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    kv_pool_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    max_num_batched_tokens: Pos
    max_num_seqs: Pos

    @model_validator(mode="after")
    def _pool(self) -> EngineSection:
        if self.kv_pool_tokens < self.page_size:
            raise ValueError(
                f"kv_pool_tokens {self.kv_pool_tokens} holds less than one page of "
                f"{self.page_size} tokens"
            )
        return self


class CostSection(Section):
    """Prices the cost tables use: inline hosted prices, or a dated rate card that replaces
    them (`rate_card`: "default" for the shipped card, or a TOML file's path), and the
    self-hosted rates (a card's `[self_hosted]` rates, where it has them, win)."""

    currency: str = Field(min_length=1)
    input_per_mtok: PosFloat
    cache_write_per_mtok: PosFloat
    cache_read_per_mtok: PosFloat
    output_per_mtok: PosFloat
    cpu_hourly: PosFloat
    rate_card: str = ""
    network_per_gb: Annotated[float, Field(ge=0)] = 0.0
    storage_per_gb_month: Annotated[float, Field(ge=0)] = 0.08

    @model_validator(mode="after")
    def _card(self) -> CostSection:
        if self.rate_card:
            # a bad card stops the run before anything loads
            card = self.card()
            if card.currency != self.currency:
                raise ValueError(
                    f"cost.currency {self.currency!r} differs from the rate card's "
                    f"{card.currency!r}; set cost.currency = {card.currency!r} (nothing is "
                    "converted)"
                )
        return self

    def card(self) -> RateCard:
        """The rate card every hosted figure is priced with."""
        from ctxlab.plan.cost import HostedPrices
        from ctxlab.plan.rate_card import RateCard, load_rate_card

        if self.rate_card:
            return load_rate_card(self.rate_card)
        prices = HostedPrices(
            input=self.input_per_mtok,
            output=self.output_per_mtok,
            cache_write=self.cache_write_per_mtok,
            cache_read=self.cache_read_per_mtok,
        )
        return RateCard.flat(prices, self.currency)

    def self_hosted_prices(self) -> SelfHostedPrices:
        """CPU time at `cpu_hourly`, transfers and storage at the card's rates or these."""
        from ctxlab.plan.self_hosted import SelfHostedPrices

        own = self.card().self_hosted if self.rate_card else SelfHostedPrices()

        def pick(card_rate: float | None, rate: float) -> float:
            return rate if card_rate is None else card_rate

        return SelfHostedPrices(
            device_hourly=own.device_hourly,
            cpu_hourly=pick(own.cpu_hourly, self.cpu_hourly),
            network_per_gb=pick(own.network_per_gb, self.network_per_gb),
            storage_per_gb_month=pick(own.storage_per_gb_month, self.storage_per_gb_month),
        )


class Workload(Section):
    requests: Pos
    input_tokens: Pos
    output_tokens: Pos


class SimWorkload(Workload):
    rate: Annotated[float, Field(ge=0)]  # arrivals per second, evenly spaced; 0: all at once


class UsefulContextSection(Section):
    enabled: bool
    tasks: list[str] = Field(min_length=1)
    lengths: list[Pos] = Field(min_length=1)
    samples: Pos
    threshold: Annotated[float, Field(gt=0, le=100)]

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, names: list[str]) -> list[str]:
        from ctxlab.eval.tasks import TASKS

        for name in names:
            if name not in TASKS:
                raise ValueError(f"{name!r} is not an eval task (known: {', '.join(TASKS)})")
        return names


class Prediction(Section):
    """How a metric should move from its baseline to the observed value, said before the run.

    `tolerance` is relative to the baseline: `unchanged` holds when |observed - baseline| <=
    tolerance x |baseline|, `down` when observed < baseline x (1 - tolerance), `up` when
    observed > baseline x (1 + tolerance). `range` = [low, high] must also hold when given.
    """

    direction: Literal["down", "up", "unchanged"]
    tolerance: Annotated[float, Field(ge=0)] = 0.0
    range: list[float] | None = None

    @field_validator("range")
    @classmethod
    def _range(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (len(value) != 2 or value[0] > value[1]):
            raise ValueError("range must be [low, high] with low <= high")
        return value


class CommonConfig(Section):
    """The tables every run has; `registry.WorkshopConfig` adds one per demonstration."""

    model: ModelSection
    engine: EngineSection
    cost: CostSection
    useful_context: UsefulContextSection
    required_metrics: list[str]
    predictions: dict[str, dict[str, Prediction]]
    servers: ServerList = Field(default_factory=list)  # [[servers]]: config_servers.py

    @model_validator(mode="after")
    def _useful_fits(self) -> CommonConfig:
        fits(self, "useful_context.lengths", max(self.useful_context.lengths))
        return self


def fits(cfg: CommonConfig, what: str, need: int, pool: bool = False) -> None:
    """Raise ValueError when `need` tokens of `what` pass max_model_len (or, with `pool`, the
    engine's KV pool): a demonstration's `check` says it before anything loads."""
    limit = cfg.model.max_model_len
    if need > limit:
        raise ValueError(f"{what} needs {need} tokens, more than model.max_model_len {limit}")
    if pool and need > cfg.engine.kv_pool_tokens:
        raise ValueError(
            f"{what} needs {need} tokens, more than engine.kv_pool_tokens "
            f"{cfg.engine.kv_pool_tokens}"
        )
