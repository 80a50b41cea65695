"""A rate card: a provider's dated hosted-API prices, with length tiers, as a small TOML file.

Providers publish a higher rate for long prompts: past a threshold (200K tokens on Gemini's
and Anthropic's long-context models) the WHOLE prompt, and the output, bill at the higher
rate, not only the tokens beyond it. A card holds one tier per threshold, each with the four
streams `cost.HostedPrices` prices (uncached input, cache write, cache read, output), plus
what makes a price comparable: its date, currency, region and service tier. An optional
`[self_hosted]` table carries the rates of the self-hosted bill (`self_hosted.py`).

The default card ships as `ctxlab/data/rate_card.toml` (dated, sourced, commented); a user's
file has the same keys. A bad file (not text, not TOML, a key missing or unknown, a price not
positive, thresholds out of order) is one sentence naming the file and the key.
"""

from __future__ import annotations

import datetime
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxlab.errors import CtxlabError
from ctxlab.plan.cost import HostedCost, HostedPrices, hosted_cost
from ctxlab.plan.self_hosted import SelfHostedPrices

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "data" / "rate_card.toml"
DEFAULT = "default"  # what `--rate-card default` names

_TOP = ("name", "date", "currency", "region", "tier", "unit_tokens", "source", "prices")
_TIER = ("above_tokens", "input", "output", "cache_write", "cache_read")
_SELF = ("device_hourly", "cpu_hourly", "network_per_gb", "storage_per_gb_month")


@dataclass(frozen=True)
class PriceTier:
    """Prices for requests whose whole prompt is longer than `above_tokens`."""

    above_tokens: int
    prices: HostedPrices


@dataclass(frozen=True)
class RateCard:
    name: str
    date: str  # ISO date the prices were published or checked
    currency: str
    region: str
    tier: str  # the provider's service tier ("paid, standard", "batch", ...)
    source: str
    tiers: tuple[PriceTier, ...]  # increasing thresholds, the first at 0
    self_hosted: SelfHostedPrices = field(default_factory=SelfHostedPrices)

    def tier_for(self, prompt_tokens: int) -> PriceTier:
        """The tier of the highest threshold the prompt is longer than."""
        chosen = self.tiers[0]
        for tier in self.tiers[1:]:
            if prompt_tokens > tier.above_tokens:
                chosen = tier
        return chosen

    def cost(
        self,
        uncached_tokens: int,
        output_tokens: int,
        cache_write_tokens: int = 0,
        cache_read_tokens: int = 0,
    ) -> HostedCost:
        """One request, each stream at the rate of the tier its whole prompt falls in."""
        prompt = uncached_tokens + cache_write_tokens + cache_read_tokens
        return hosted_cost(
            self.tier_for(prompt).prices,
            uncached_tokens,
            output_tokens,
            cache_write_tokens,
            cache_read_tokens,
        )

    def tier_label(self, prompt_tokens: int) -> str:
        above = self.tier_for(prompt_tokens).above_tokens
        return "base" if above == 0 else f"> {above:,} tokens"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "date": self.date,
            "currency": self.currency,
            "region": self.region,
            "tier": self.tier,
            "source": self.source,
            "unit_tokens": self.tiers[0].prices.unit,
            "prices": [
                {
                    "above_tokens": t.above_tokens,
                    "input": t.prices.input,
                    "output": t.prices.output,
                    "cache_write": t.prices.write,
                    "cache_read": t.prices.read,
                }
                for t in self.tiers
            ],
            "self_hosted": {k: getattr(self.self_hosted, k) for k in _SELF},
        }

    @classmethod
    def flat(cls, prices: HostedPrices, currency: str = "USD") -> RateCard:
        """One tier from prices given on the command line or in a config (no date known)."""
        return cls(
            name="prices given",
            date="not given",
            currency=currency,
            region="not given",
            tier="not given",
            source="given",
            tiers=(PriceTier(0, prices),),
        )


def load_rate_card(path: str | Path) -> RateCard:
    """`default` (the shipped card) or a TOML file; every mistake is one CtxlabError."""
    if str(path) == DEFAULT:
        path = DEFAULT_PATH
    path = Path(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise CtxlabError(f"rate card {path} is a folder; give a .toml file") from None
    except FileNotFoundError:
        raise CtxlabError(
            f"rate card {path} does not exist; give a .toml file, or 'default' for the "
            f"shipped card ({DEFAULT_PATH})"
        ) from None
    except OSError as exc:
        raise CtxlabError(f"rate card {path} cannot be read: {exc.strerror}") from None
    return parse_rate_card(raw, str(path))


def parse_rate_card(raw: bytes | str, where: str = "rate card") -> RateCard:
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CtxlabError(
                f"rate card {where} is not a text file (not UTF-8); a rate card is TOML"
            ) from None
    if "\x00" in raw:
        raise CtxlabError(f"rate card {where} is not a text file (it holds NUL bytes)")
    try:
        data = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as exc:
        raise CtxlabError(f"rate card {where} is not valid TOML: {exc}") from None
    _keys(data, _TOP, ("self_hosted",), where, "")
    tiers_raw = data["prices"]
    if not isinstance(tiers_raw, list) or not tiers_raw:
        raise CtxlabError(f"rate card {where}: prices must be one or more [[prices]] tables")
    unit = data["unit_tokens"]
    if not isinstance(unit, int) or isinstance(unit, bool) or unit <= 0:
        raise CtxlabError(
            f"rate card {where}: unit_tokens must be a positive integer, got {unit!r}"
        )
    tiers = []
    for i, tier in enumerate(tiers_raw):
        at = f"prices[{i}]."
        if not isinstance(tier, dict):
            raise CtxlabError(f"rate card {where}: prices[{i}] must be a table")
        _keys(tier, _TIER, (), where, at)
        above = tier["above_tokens"]
        if not isinstance(above, int) or isinstance(above, bool) or above < 0:
            raise CtxlabError(
                f"rate card {where}: {at}above_tokens must be a whole number of tokens, 0 or "
                f"more, got {above!r}"
            )
        if i == 0 and above != 0:
            raise CtxlabError(
                f"rate card {where}: the first [[prices]] tier must start at above_tokens = 0 "
                f"(it prices every prompt up to the next threshold), got {above:,}"
            )
        if tiers and above <= tiers[-1].above_tokens:
            raise CtxlabError(
                f"rate card {where}: tiers out of order: {at}above_tokens {above:,} must be "
                f"larger than the tier before it ({tiers[-1].above_tokens:,})"
            )
        values = {k: _price(tier[k], where, at + k) for k in _TIER[1:]}
        tiers.append(PriceTier(above, HostedPrices(unit=unit, **values)))
    self_raw = data.get("self_hosted", {})
    if not isinstance(self_raw, dict):
        raise CtxlabError(f"rate card {where}: self_hosted must be a table")
    _keys(self_raw, (), _SELF, where, "self_hosted.")
    self_hosted = SelfHostedPrices(
        **{k: _price(v, where, f"self_hosted.{k}", free=True) for k, v in self_raw.items()}
    )
    return RateCard(
        name=_text(data["name"], where, "name"),
        date=_date(data["date"], where),
        currency=_text(data["currency"], where, "currency"),
        region=_text(data["region"], where, "region"),
        tier=_text(data["tier"], where, "tier"),
        source=_text(data["source"], where, "source"),
        tiers=tuple(tiers),
        self_hosted=self_hosted,
    )


def _keys(
    table: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...], where: str, at: str
) -> None:
    missing = [k for k in required if k not in table]
    if missing:
        raise CtxlabError(
            f"rate card {where}: missing {', '.join(at + k for k in missing)} "
            f"(a card needs {', '.join(at + k for k in required)})"
        )
    unknown = [k for k in table if k not in required and k not in optional]
    if unknown:
        raise CtxlabError(
            f"rate card {where}: unknown key {at}{unknown[0]} (allowed: "
            f"{', '.join(at + k for k in required + optional)})"
        )


def _price(value: Any, where: str, key: str, free: bool = False) -> float:
    """A finite price above zero (or, with `free`, zero or above)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0 or (value == 0 and not free):
        what = "zero or a positive price" if free else "a positive price"
        raise CtxlabError(f"rate card {where}: {key} must be {what}, got {value!r}")
    return float(value)


def _text(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CtxlabError(f"rate card {where}: {key} must be non-empty text, got {value!r}")
    return value.strip()


def _date(value: Any, where: str) -> str:
    if isinstance(value, datetime.datetime):
        return value.date().isoformat()
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value.strip()).isoformat()
        except ValueError:
            pass
    raise CtxlabError(
        f"rate card {where}: date must be the day the prices were published, as 2025-11-18, "
        f"got {value!r}"
    )


def price(
    prices: HostedPrices | RateCard,
    uncached_tokens: int,
    output_tokens: int,
    cache_write_tokens: int = 0,
    cache_read_tokens: int = 0,
) -> HostedCost:
    """One request under a rate card (its length tier) or flat prices (one tier)."""
    card = prices if isinstance(prices, RateCard) else RateCard.flat(prices)
    return card.cost(uncached_tokens, output_tokens, cache_write_tokens, cache_read_tokens)
