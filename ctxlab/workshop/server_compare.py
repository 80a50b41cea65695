"""Several servers side by side (`[[servers]]` in the workshop config): what the probe finds
on each, and demonstration 3 (reuse granularity and rounding waste) on each.

The first server carries every demonstration (`runner.py`); every listed server, the first
included, gets the probe's cheap sections here: identification (engine, version, model,
context, slots, `/metrics`, `/tokenize`), whether it reports cached tokens, the divergence
staircase (granularity and kind of cache) and the `cache_salt` isolation test. The same
staircase positions are sent to every server, so the reuse table compares like with like.
Each table names its servers; a figure a server cannot give is "not measurable" with the
reason, in the cell's place.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxlab.probe import calibration, isolation, prefix
from ctxlab.probe.figures import Figure
from ctxlab.probe.prompts import TokenRule, Words
from ctxlab.probe.runner import kind_of_cache
from ctxlab.workshop.result import Column, Table

if TYPE_CHECKING:
    from ctxlab.workshop.server_backend import ServerLLM


@dataclass
class Summary:
    """One server as the probe's cheap sections saw it."""

    name: str  # the config's label (or "server" for --server)
    server: ServerLLM
    cached: bool
    staircase: prefix.PrefixResult
    isolates: Figure

    @property
    def page(self) -> int | None:
        v = self.staircase.granularity.value
        return v if isinstance(v, int) else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.server.label(code=True),
            "info": self.server.info.as_dict(),
            "cached_tokens_reported": self.cached,
            "granularity": self.staircase.granularity.as_dict(),
            "kind_of_cache": kind_of_cache(self.server.info, self.staircase.granularity).as_dict(),
            "isolation": self.isolates.as_dict(),
            "staircase": self.staircase.points,
        }


def calibrate(server: ServerLLM) -> tuple[Words, TokenRule]:
    """Fresh words and the server's token rule for them (`ctxlab.probe.calibration`: none
    its tokenizer splits, where it has /tokenize)."""
    return calibration.calibrate(server.client, server.info, secrets.randbits(32))


def probe_page(server: ServerLLM, longest: int) -> prefix.PrefixResult:
    """The server's divergence staircase (`ctxlab probe`'s prefix section)."""
    words, rule = calibrate(server)
    return prefix.measure(server.client, words, rule, longest, lambda _m: None)


def summarize(
    name: str, server: ServerLLM, longest: int, staircase: prefix.PrefixResult | None = None
) -> Summary:
    """The cheap probe sections on one server (the staircase reused when already measured)."""
    cached = server.reports_cached()
    pre = staircase or probe_page(server, longest)
    words, rule = calibrate(server)
    iso = isolation.measure(server.client, words, rule, secrets.randbits(32), lambda _m: None)
    return Summary(name, server, cached, pre, iso.isolates)


def _shown(f: Figure) -> str:
    return f.shown() if f.how != "not measurable" else f"not measurable ({f.note})"


def probe_table(summaries: list[Summary]) -> Table:
    """The probe summary, one row per server."""
    t = Table(
        "servers_probe", "storage", "The servers side by side: what the probe found", "measured",
        [Column("server"), Column("engine and version"), Column("model"),
         Column("context tokens"), Column("slots"), Column("cached tokens reported"),
         Column("reuse granularity (tokens)"), Column("kind of cache"),
         Column("cache_salt isolates"), Column("/metrics"), Column("/tokenize")],
        note="granularity: the divergence staircase (`ctxlab.probe.prefix`); isolation: the "
        "same prompt under two cache_salt values (`ctxlab.probe.isolation`); context and "
        "slots: as the server publishes them (n/a: it does not)",
    )  # fmt: skip
    for s in summaries:
        info = s.server.info
        kind = kind_of_cache(info, s.staircase.granularity)
        t.add(
            s.name,
            f"{info.engine} {info.version}".strip(),
            info.model.rsplit("/", 1)[-1],
            info.max_model_len,
            info.slots,
            "yes" if s.cached else "no (not measurable: no cached_tokens or timings.cache_n)",
            s.page if s.page is not None else _shown(s.staircase.granularity),
            _shown(kind),
            _shown(s.isolates),
            "yes" if info.has_metrics else "no",
            "yes" if info.has_tokenize else "no",
        )
    return t


def page_tables(summaries: list[Summary], request_tokens: list[int]) -> list[Table]:
    """Demonstration 3 on every server: reuse at the same divergence points, and the
    rounding waste each probed page implies for the config's request lengths."""
    names = [s.name for s in summaries]
    reuse = Table(
        "page_size_servers_reuse", "storage",
        "Demonstration 3 side by side: reused tokens after a divergence, per server",
        "measured",
        [Column("diverges at token"), *[Column(f"reused on {n}") for n in names]],
        note="the same divergence positions sent to every server (fresh words each); reused "
        "= the server's cached_tokens for the diverging prompt; n/a: not measurable (the "
        "server does not report cached tokens)",
    )  # fmt: skip
    by_pos = [{p["position"]: p["cached"] for p in s.staircase.points} for s in summaries]
    for pos in sorted(set().union(*by_pos)):
        reuse.add(pos, *[b.get(pos) for b in by_pos])
    waste = Table(
        "page_size_servers_waste", "storage",
        "Demonstration 3 side by side: rounding waste each server's page implies", "measured",
        [Column("server"), Column("page (tokens)"),
         *[Column(f"waste % at {n} tokens", 1) for n in request_tokens]],
        note="slots = ceil(tokens / page) x page with the probed page; n/a: the page was not "
        "resolved (not measurable)",
    )  # fmt: skip
    for s in summaries:
        p = s.page
        cells = [
            100 * (math.ceil(n / p) * p - n) / (math.ceil(n / p) * p) if p else None
            for n in request_tokens
        ]
        waste.add(s.name, p, *cells)
    return [reuse, waste]
