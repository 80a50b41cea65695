"""Demonstration 2: a warm prefix lowers TTFT; it does not change the time per output token.

Requests of one shape (shared prefix + own suffix + output) are sent one at a time, cold and
warm interleaved so both see the same machine: a cold request's prefix is new text, a warm
one's is the prefix already in the cache. Reuse removes prefill work, so TTFT falls; every
output token still attends over the whole context, so TPOT and inter-token latency should
not move. The spread of the repeats is the noise the comparison is read against.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Annotated

from pydantic import Field

from ctxlab.plan.rate_card import RateCard
from ctxlab.progress import Tracker
from ctxlab.stats import median_interval
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


def steps(session: Session) -> int:
    return 1 + 2 * DEMO.config(session.cfg).repeats


def prices(session: Session) -> RateCard:
    return session.cfg.cost.card()


def run(session: Session, tracker: Tracker) -> DemoResult:
    cfg = DEMO.config(session.cfg)
    res = DemoResult.of(DEMO, "run", "measured")
    llm = session.requests.generator()
    prefix = session.text_ids(cfg.prefix_tokens)
    send(llm, prefix + session.text_ids(cfg.suffix_tokens), 2)  # puts the prefix in the cache
    tracker.advance()
    runs: dict[str, list[Sent]] = {"cold": [], "warm": []}
    for i in range(cfg.repeats):
        # Alternate which side goes first, so neither always runs right after the other.
        for side in ("cold", "warm") if i % 2 == 0 else ("warm", "cold"):
            head = session.text_ids(cfg.prefix_tokens) if side == "cold" else prefix
            ids = head + session.text_ids(cfg.suffix_tokens)
            runs[side].append(send(llm, ids, cfg.output_tokens))
            tracker.advance()
    slot = session.requests.slot_bytes(llm)
    session.note_resident("demonstration 2", runs["warm"][0].resident_kv_bytes, slot)

    stats = {side: _stats(sent) for side, sent in runs.items()}
    _tables(session, res, stats, slot, cfg)
    c, w = stats["cold"], stats["warm"]
    cold, warm = runs["cold"], runs["warm"]
    res.observe_latency(
        "ttft_ms", [s.ttft_ms for s in cold], [s.ttft_ms for s in warm], 1, c["ttft_spread"]
    )
    res.observe("recomputed_tokens", c["recomputed"], w["recomputed"])
    res.observe("reused_tokens", c["reused"], w["reused"])
    res.observe_latency(
        "tpot_ms", [s.tpot_ms for s in cold], [s.tpot_ms for s in warm], 2, c["tpot_spread"]
    )
    res.observe("itl_ms", c["itl_p50"], w["itl_p50"], 2, noise=c["itl_spread"])
    _explain(res, stats, slot, cfg, session.cfg.cost.currency)
    res.plots.append(draw(runs, DEMO.plot("2_warm_prefix.png").path(session.out)))
    return res


def _stats(sent: list[Sent]) -> dict[str, float]:
    ttft = [s.ttft_ms for s in sent]
    tpot = [s.tpot_ms for s in sent]
    itl = [g * 1e3 for s in sent for g in s.itl_s]
    per_request_itl = [statistics.median(s.itl_s) * 1e3 for s in sent if s.itl_s]
    ttft_ci = median_interval(ttft)
    return {
        "n": len(sent),
        "reused": int(median([s.reused for s in sent])),
        "recomputed": int(median([s.recomputed for s in sent])),
        "prompt": int(median([s.prompt_tokens for s in sent])),
        "ttft_med": median(ttft),
        "ttft_med_low": ttft_ci.low,
        "ttft_med_high": ttft_ci.high,
        "ttft_min": min(ttft),
        "ttft_max": max(ttft),
        "ttft_spread": spread(ttft),
        "tpot_med": median(tpot),
        "tpot_min": min(tpot),
        "tpot_max": max(tpot),
        "tpot_spread": spread(tpot),
        "itl_p50": pct(itl, 50),
        "itl_p90": pct(itl, 90),
        "itl_p99": pct(itl, 99),
        "itl_gaps": len(itl),
        "itl_spread": spread(per_request_itl),
        "cpu_s": median([s.cpu_s for s in sent]),
    }


def _tables(session: Session, res: DemoResult, stats: dict, slot: int, cfg) -> None:
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
    rate = session.cfg.cost.cpu_hourly
    p = prices(session)
    for side in ("cold", "warm"):
        s = stats[side]
        storage.add(side, s["prompt"], s["reused"], s["recomputed"], s["reused"] * slot / 2**20)
        serving.add(
            side,
            s["ttft_med"],
            s["ttft_med_low"],
            s["ttft_med_high"],
            s["ttft_min"],
            s["ttft_max"],
            s["tpot_med"],
            s["tpot_min"],
            s["tpot_max"],
            s["itl_p50"],
            s["itl_p90"],
            s["itl_p99"],
            s["itl_gaps"],
        )
        prefix, suffix = cfg.prefix_tokens, s["prompt"] - cfg.prefix_tokens
        hosted = p.cost(
            suffix,
            cfg.output_tokens,
            cache_write_tokens=prefix if side == "cold" else 0,
            cache_read_tokens=prefix if side == "warm" else 0,
        ).total
        s["hosted_per_1000"] = hosted * 1000
        s["self_per_1000"] = s["cpu_s"] * rate / 3600 * 1000
        cost.add(side, s["hosted_per_1000"], s["cpu_s"], s["self_per_1000"])
    res.tables += [storage, serving, cost]


def _explain(res: DemoResult, stats: dict, slot: int, cfg, currency: str) -> None:
    f = res.figures
    c, w = stats["cold"], stats["warm"]
    res.summary = (
        f"{f.say('repeats', cfg.repeats)} cold and {cfg.repeats} warm requests of "
        f"{f.say('prompt_tokens', c['prompt'])} prompt tokens and "
        f"{f.say('output_tokens', cfg.output_tokens)} output tokens, one at a time."
    )
    noise = f.say("ttft_cold_spread_pct", 100 * c["ttft_spread"], 1)
    tpot_noise = f.say("tpot_cold_spread_pct", 100 * c["tpot_spread"], 1)
    tpot_change = 100 * (w["tpot_med"] - c["tpot_med"]) / c["tpot_med"]
    res.gains.append(
        Gain(
            "a warm prefix",
            f"the cache served {f.say('reused_warm', w['reused'])} of "
            f"{c['prompt']} prompt tokens "
            f"({f.say('reused_warm_mib', w['reused'] * slot / 2**20, 2)} "
            f"MiB of KV kept from an earlier request), so only "
            f"{f.say('recomputed_warm', w['recomputed'])} tokens were computed instead of "
            f"{f.say('recomputed_cold', c['recomputed'])}",
            f"median TTFT fell from {f.say('ttft_cold_ms', c['ttft_med'], 1)} ms to "
            f"{f.say('ttft_warm_ms', w['ttft_med'], 1)} ms (cold repeats scatter by {noise}% of "
            f"their median); hosted, a request costs "
            f"{f.say('hosted_warm_1000', w['hosted_per_1000'], 4)} instead of "
            f"{f.say('hosted_cold_1000', c['hosted_per_1000'], 4)} {currency} per 1,000 requests",
        )
    )
    res.gains.append(
        Gain(
            "time per output token (no gain expected)",
            "decode reads the whole context's KV at every step whether it was computed now or "
            "reused, so the work per output token is the same on both sides",
            f"median TPOT {f.say('tpot_cold_ms', c['tpot_med'], 2)} ms cold and "
            f"{f.say('tpot_warm_ms', w['tpot_med'], 2)} ms warm, a change of "
            f"{f.say('tpot_change_pct', tpot_change, 1)}% against a spread of {tpot_noise}% "
            "between cold repeats: reuse buys first-token latency, not decode speed",
        )
    )


def draw(runs: dict[str, list[Sent]], path: Path) -> Path:
    """TTFT and TPOT of every repeat, cold against warm (the spread is the point)."""
    from ctxlab.workshop.plots import figure, save

    fig, (left, right) = figure()
    for ax, what, label in ((left, "ttft_ms", "TTFT (ms)"), (right, "tpot_ms", "TPOT (ms)")):
        for x, side in enumerate(("cold", "warm")):
            ys = [getattr(s, what) for s in runs[side]]
            ax.scatter([x] * len(ys), ys, alpha=0.7, label=side)
        ax.set_xticks([0, 1], ["cold", "warm"])
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
