"""Demonstration 2: a warm prefix lowers TTFT; it does not change the time per output token.

Requests of one shape (shared prefix + own suffix + output) are sent one at a time, cold and
warm interleaved so both see the same machine: a cold request's prefix is new text, a warm
one's is the prefix already in the cache. Reuse removes prefill work, so TTFT falls; every
output token still attends over the whole context, so TPOT and inter-token latency should
not move. The spread of the repeats is the noise the comparison is read against.

The file is in three parts: `measure` returns frozen records (`Records`, one `SideRuns` per
side), `verdicts` records the observations the predictions are judged on (the one place it
judges), and the tables, prose and plot are rendered from the records.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from ctxlab.plan.rate_card import RateCard
from ctxlab.progress import Tracker
from ctxlab.stats import Interval, median_interval
from ctxlab.workshop.config import CommonConfig, Pos, Section, fits
from ctxlab.workshop.demonstration import (
    Demonstration,
    FigureValues,
    Metric,
    Plot,
    Risk,
    ServerMode,
)
from ctxlab.workshop.measure import Sent, median, pct, send, spread
from ctxlab.workshop.result import Column, DemoResult, Gain, Table, fmt
from ctxlab.workshop.session import Session

Side = Literal["cold", "warm"]
SIDES: tuple[Side, ...] = ("cold", "warm")


def steps(session: Session) -> int:
    return 1 + 2 * DEMO.config(session.cfg).repeats


def prices(session: Session) -> RateCard:
    return session.cfg.cost.card()


@dataclass(frozen=True)
class SideRuns:
    """Every request of one side; its statistics are read from them, never stored apart."""

    side: Side
    sent: tuple[Sent, ...]

    @property
    def n(self) -> int:
        return len(self.sent)

    @property
    def reused(self) -> int:
        return int(median([s.reused for s in self.sent]))

    @property
    def recomputed(self) -> int:
        return int(median([s.recomputed for s in self.sent]))

    @property
    def prompt(self) -> int:
        return int(median([s.prompt_tokens for s in self.sent]))

    @property
    def ttfts(self) -> list[float]:
        return [s.ttft_ms for s in self.sent]

    @property
    def tpots(self) -> list[float]:
        return [s.tpot_ms for s in self.sent]

    @property
    def ttft_interval(self) -> Interval:
        """The median TTFT's 95 % bootstrap interval over the side's requests."""
        return median_interval(self.ttfts)

    @property
    def itl_ms(self) -> list[float]:
        """Every gap between consecutive output tokens of the side, pooled."""
        return [g * 1e3 for s in self.sent for g in s.itl_s]

    @property
    def itl_spread(self) -> float:
        """The spread of the requests' own median gaps: the ITL's noise."""
        return spread([statistics.median(s.itl_s) * 1e3 for s in self.sent if s.itl_s])

    @property
    def cpu_s(self) -> float:
        return median([s.cpu_s for s in self.sent])


@dataclass(frozen=True)
class Records:
    """What demonstration 2 measured; every table, verdict and sentence reads these."""

    slot_bytes: int  # one token slot over every layer and KV head, read from the pool
    cold: SideRuns
    warm: SideRuns

    def side(self, side: Side) -> SideRuns:
        return self.cold if side == "cold" else self.warm


@dataclass(frozen=True)
class Cost:
    """One request's price on each side, per 1,000 requests."""

    hosted_per_1000: float
    self_per_1000: float


def measure(session: Session, tracker: Tracker) -> Records:
    """Prime the prefix, then cold and warm requests alternating (nothing formatted)."""
    cfg = DEMO.config(session.cfg)
    llm = session.requests.generator()
    prefix = session.text_ids(cfg.prefix_tokens)
    send(llm, prefix + session.text_ids(cfg.suffix_tokens), 2)  # puts the prefix in the cache
    tracker.advance()
    runs: dict[Side, list[Sent]] = {"cold": [], "warm": []}
    for i in range(cfg.repeats):
        # Alternate which side goes first, so neither always runs right after the other.
        for side in SIDES if i % 2 == 0 else SIDES[::-1]:
            head = session.text_ids(cfg.prefix_tokens) if side == "cold" else prefix
            ids = head + session.text_ids(cfg.suffix_tokens)
            runs[side].append(send(llm, ids, cfg.output_tokens))
            tracker.advance()
    slot = session.requests.slot_bytes(llm)
    session.note_resident("demonstration 2", runs["warm"][0].resident_kv_bytes, slot)
    return Records(
        slot, SideRuns("cold", tuple(runs["cold"])), SideRuns("warm", tuple(runs["warm"]))
    )


def verdicts(r: Records, res: DemoResult) -> None:
    """The metrics the run's predictions are judged on (`res.observe`): the one place this
    demonstration judges (`ctxlab.workshop.verdicts` reads them against the config)."""
    c, w = r.cold, r.warm
    res.observe_latency("ttft_ms", c.ttfts, w.ttfts, 1, spread(c.ttfts))
    res.observe("recomputed_tokens", c.recomputed, w.recomputed)
    res.observe("reused_tokens", c.reused, w.reused)
    res.observe_latency("tpot_ms", c.tpots, w.tpots, 2, spread(c.tpots))
    res.observe("itl_ms", pct(c.itl_ms, 50), pct(w.itl_ms, 50), 2, noise=c.itl_spread)


def costs(session: Session, s: SideRuns) -> Cost:
    """Hosted: the cold prefix written to the provider's cache, the warm one read back;
    self-hosted: the request's measured CPU seconds at the configured hourly rate."""
    cfg = DEMO.config(session.cfg)
    prefix, suffix = cfg.prefix_tokens, s.prompt - cfg.prefix_tokens
    hosted = (
        prices(session)
        .cost(
            suffix,
            cfg.output_tokens,
            cache_write_tokens=prefix if s.side == "cold" else 0,
            cache_read_tokens=prefix if s.side == "warm" else 0,
        )
        .total
    )
    return Cost(hosted * 1000, s.cpu_s * session.cfg.cost.cpu_hourly / 3600 * 1000)


def run(session: Session, tracker: Tracker) -> DemoResult:
    """Measure, judge, then render tables, prose and the plot from the records."""
    records = measure(session, tracker)
    res = DemoResult.of(DEMO, "run", "measured")
    price = {side: costs(session, records.side(side)) for side in SIDES}
    _tables(session, res, records, price)
    verdicts(records, res)
    _explain(session, res, records, price)
    res.plots.append(draw(records, DEMO.plot("2_warm_prefix.png").path(session.out)))
    return res


def _tables(session: Session, res: DemoResult, r: Records, price: dict[Side, Cost]) -> None:
    cfg = DEMO.config(session.cfg)
    slot = r.slot_bytes
    storage = Table(
        "warm_prefix_storage",
        "storage",
        "Demonstration 2: what a warm prefix keeps (per request, median of the repeats)",
        "measured",
        [
            Column("prefix"),
            Column("prompt tokens"),
            Column("reused tokens"),
            Column("recomputed tokens"),
            Column("reused KV MiB", 2),
        ],
        note=f"one token slot holds {res.figures.say('slot_bytes', slot)} bytes over every layer "
        "and KV head, read from the pool",
    )
    serving = Table(
        "warm_prefix_serving",
        "serving",
        f"Demonstration 2: cold against warm prefix, {cfg.repeats} requests each, alternating",
        "measured",
        [
            Column("prefix"),
            Column("TTFT median ms", 1),
            Column("TTFT median 95 % low", 1),
            Column("TTFT median 95 % high", 1),
            Column("TTFT min ms", 1),
            Column("TTFT max ms", 1),
            Column("TPOT median ms", 2),
            Column("TPOT min ms", 2),
            Column("TPOT max ms", 2),
            Column("ITL p50 ms", 2),
            Column("ITL p90 ms", 2),
            Column("ITL p99 ms", 2),
            Column("ITL gaps"),
        ],
        note="ITL percentiles pool every gap between consecutive output tokens of the side "
        "(their count beside them); the TTFT median's 95 % interval is a bootstrap over the "
        "side's requests (ctxlab.stats)",
    )
    cost = Table(
        "warm_prefix_cost",
        "cost",
        "Demonstration 2: cost of one request, cold against warm",
        "measured",
        [
            Column("prefix"),
            Column(f"hosted API {session.cfg.cost.currency} per 1,000 requests", 4),
            Column("CPU seconds per request", 3),
            Column(f"self-hosted {session.cfg.cost.currency} per 1,000 requests", 4),
        ],
        note="hosted: the cold prefix is written to the provider's cache and the warm one read "
        "back, the suffix billed as uncached input, the output as output; self-hosted: the "
        "request's measured CPU seconds at the configured hourly rate",
    )
    for side in SIDES:
        s, c = r.side(side), price[side]
        storage.add(side, s.prompt, s.reused, s.recomputed, s.reused * slot / 2**20)
        ttft, tpot, itl = s.ttfts, s.tpots, s.itl_ms
        serving.add(
            side,
            median(ttft),
            s.ttft_interval.low,
            s.ttft_interval.high,
            min(ttft),
            max(ttft),
            median(tpot),
            min(tpot),
            max(tpot),
            pct(itl, 50),
            pct(itl, 90),
            pct(itl, 99),
            len(itl),
        )
        cost.add(side, c.hosted_per_1000, s.cpu_s, c.self_per_1000)
    res.tables += [storage, serving, cost]


def _explain(session: Session, res: DemoResult, r: Records, price: dict[Side, Cost]) -> None:
    f = res.figures
    cfg, currency = DEMO.config(session.cfg), session.cfg.cost.currency
    c, w = r.cold, r.warm
    c_tpot, w_tpot = median(c.tpots), median(w.tpots)
    res.summary = (
        f"{f.say('repeats', cfg.repeats)} cold and {cfg.repeats} warm requests of "
        f"{f.say('prompt_tokens', c.prompt)} prompt tokens and "
        f"{f.say('output_tokens', cfg.output_tokens)} output tokens, one at a time."
    )
    noise = f.say("ttft_cold_spread_pct", 100 * spread(c.ttfts), 1)
    tpot_noise = f.say("tpot_cold_spread_pct", 100 * spread(c.tpots), 1)
    tpot_change = 100 * (w_tpot - c_tpot) / c_tpot
    res.gains.append(
        Gain(
            "a warm prefix",
            f"the cache served {f.say('reused_warm', w.reused)} of "
            f"{c.prompt} prompt tokens "
            f"({f.say('reused_warm_mib', w.reused * r.slot_bytes / 2**20, 2)} "
            f"MiB of KV kept from an earlier request), so only "
            f"{f.say('recomputed_warm', w.recomputed)} tokens were computed instead of "
            f"{f.say('recomputed_cold', c.recomputed)}",
            f"median TTFT fell from {f.say('ttft_cold_ms', median(c.ttfts), 1)} ms to "
            f"{f.say('ttft_warm_ms', median(w.ttfts), 1)} ms (cold repeats scatter by {noise}% "
            f"of their median); hosted, a request costs "
            f"{f.say('hosted_warm_1000', price['warm'].hosted_per_1000, 4)} instead of "
            f"{f.say('hosted_cold_1000', price['cold'].hosted_per_1000, 4)} {currency} per "
            "1,000 requests",
        )
    )
    res.gains.append(
        Gain(
            "time per output token (no gain expected)",
            "decode reads the whole context's KV at every step whether it was computed now or "
            "reused, so the work per output token is the same on both sides",
            f"median TPOT {f.say('tpot_cold_ms', c_tpot, 2)} ms cold and "
            f"{f.say('tpot_warm_ms', w_tpot, 2)} ms warm, a change of "
            f"{f.say('tpot_change_pct', tpot_change, 1)}% against a spread of {tpot_noise}% "
            "between cold repeats: reuse buys first-token latency, not decode speed",
        )
    )


def draw(r: Records, path: Path) -> Path:
    """TTFT and TPOT of every repeat, cold against warm (the spread is the point)."""
    from ctxlab.workshop.plots import figure, save

    fig, (left, right) = figure()
    for ax, what, label in ((left, "ttft_ms", "TTFT (ms)"), (right, "tpot_ms", "TPOT (ms)")):
        for x, side in enumerate(SIDES):
            ys = [getattr(s, what) for s in r.side(side).sent]
            ax.scatter([x] * len(ys), ys, alpha=0.7, label=side)
        ax.set_xticks([0, 1], list(SIDES))
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    left.set_title("first token: reuse removes prefill")
    right.set_title("per output token: unchanged")
    return save(fig, path)


# -- declarations ---------------------------------------------------------------------------


class WarmPrefixSection(Section):
    prefix_tokens: Pos
    suffix_tokens: Pos
    output_tokens: Annotated[int, Field(ge=2)]
    repeats: Annotated[int, Field(ge=3)]


_COLD, _WARM = "cold prefix (median)", "warm prefix (median)"
METRICS = (
    Metric("ttft_ms", "ms", _COLD, _WARM, "time to first token"),
    Metric("recomputed_tokens", "tokens", _COLD, _WARM, "prompt tokens computed"),
    Metric("reused_tokens", "tokens", _COLD, _WARM, "prompt tokens served by the prefix cache"),
    Metric("tpot_ms", "ms", _COLD, _WARM, "time per output token after the first"),
    Metric("itl_ms", "ms", _COLD, _WARM, "median gap between consecutive output tokens"),
)

TOML = """\
# -- 2: cold against warm prefix -------------------------------------------------------------
[warm_prefix]
prefix_tokens = 768           # the shared prefix (a system prompt, a document)
suffix_tokens = 32            # each request's own question after it
output_tokens = 32            # enough tokens to measure inter-token latency
repeats = 6                   # cold and warm requests each, alternating, to show the spread
"""

PREDICTIONS_TOML = """\
[predictions.warm_prefix]     # baseline: cold prefix; observed: warm prefix
ttft_ms = { direction = "down" }
recomputed_tokens = { direction = "down" }
reused_tokens = { direction = "up" }
tpot_ms = { direction = "unchanged", tolerance = 0.25 }
itl_ms = { direction = "unchanged", tolerance = 0.25 }
"""

QUICK_TOML = """\
[quick.warm_prefix]
prefix_tokens = 256
output_tokens = 8
repeats = 3
"""


def check(wp: WarmPrefixSection, cfg: CommonConfig) -> None:
    fits(cfg, "warm_prefix", wp.prefix_tokens + wp.suffix_tokens + wp.output_tokens, pool=True)


def _guard_payload(f: FigureValues) -> tuple[str, str]:
    return "guarded", (
        f"demonstration {DEMO.number} separates them: reuse removed prefill work (median TTFT "
        f"{fmt(f['ttft_cold_ms'], 1)} -> {fmt(f['ttft_warm_ms'], 1)} ms) while decode, which "
        f"reads the whole KV payload at every step, kept its pace (TPOT {fmt(f['tpot_cold_ms'], 2)}"
        f" -> {fmt(f['tpot_warm_ms'], 2)} ms)"
    )


def _guard_pricing(f: FigureValues) -> tuple[str, str]:
    return "partly guarded", (
        f"the cost tables price a miss and a hit separately (hosted "
        f"{fmt(f['hosted_cold_1000'], 4)} against {fmt(f['hosted_warm_1000'], 4)} per 1,000 "
        "requests) and self-hosted cost from measured CPU seconds; every request here "
        "succeeded, so failures cost nothing in this run, and idle reserve is not priced"
    )


DEMO = Demonstration(
    number=2,
    key="warm_prefix",
    title="TTFT and inter-token latency after a warm prefix",
    section=WarmPrefixSection,
    metrics=METRICS,
    layers=("storage", "serving", "cost"),
    steps=steps,
    run=run,
    toml=TOML,
    predictions_toml=PREDICTIONS_TOML,
    quick_toml=QUICK_TOML,
    guards=((Risk.PAYLOAD_VS_COMPUTE, _guard_payload), (Risk.PRICING, _guard_pricing)),
    check=check,
    required=("ttft_ms", "tpot_ms"),
    plots=(Plot("2_warm_prefix.png", "TTFT and TPOT of every repeat, cold against warm"),),
    server=ServerMode(through=True, needs_cached_tokens=True),
)
