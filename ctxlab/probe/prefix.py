"""Is prefix caching on, and at what granularity: the staircase of cached tokens.

A base prompt is sent twice (cold, then warm). Then prompts that share the base's first d
tokens and diverge at token d (a different word, then fresh words) are sent for d from the
longest position down. A cache of fixed-size pages (vLLM, SGLang with --page-size,
`ctxlab serve`) reports floor(d / P) x P cached tokens: a staircase whose step is the page
size P. A cache that reuses the longest common prefix token by token (llama.cpp's slots,
SGLang's radix tree at page size 1) reports d: a staircase of step 1. The positions go
down so that a server that keeps one prompt per slot still holds the longest shared prefix
when each prompt arrives. Positions count the server's tokens (the offset it adds is
included).

Without a cached-token report the only evidence is time: the warm request's TTFT against a
cold one of the same length. That says "on" or "off" (inferred); granularity is then not
measurable.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ctxlab.probe.client import Answer, ProbeClient
from ctxlab.probe.figures import Figure
from ctxlab.probe.prompts import TokenRule, Words, text

TAIL = 8  # fresh tokens after each divergence point (so no prompt is wholly cached)


def positions(longest: int) -> list[int]:
    """Divergence positions in tokens, longest first: every 7th token from 5 (7 is prime,
    so the points fall at every offset within a page of 8..128 tokens)."""
    return sorted(range(5, longest + 1, 7), reverse=True)


def planned(longest: int) -> tuple[int, int]:
    """(requests, prompt tokens) this section sends at most."""
    ps = positions(longest)
    base = longest + TAIL
    return 3 + len(ps), 3 * base + sum(p + TAIL for p in ps)


@dataclass
class PrefixResult:
    enabled: Figure
    granularity: Figure
    identical_reuse: Figure
    points: list[dict[str, int]] = field(default_factory=list)  # position, prompt, cached
    cached_source: str = ""

    def figures(self) -> list[Figure]:
        return [self.enabled, self.granularity, self.identical_reuse]


def measure(
    client: ProbeClient,
    words: Words,
    rule: TokenRule,
    longest: int,
    step: Callable[[str], None],
) -> PrefixResult:
    base_tokens = longest + TAIL
    base = words.take(rule.words_for(base_tokens))
    cold = client.complete(text(base), base_tokens)
    step("prefix: cold base prompt")
    warm = client.complete(text(base), base_tokens)
    step("prefix: same prompt again")
    if warm.cached_tokens is None:
        other = words.take(len(base))
        cold2 = client.complete(text(other), base_tokens)
        step("prefix: a second cold prompt")
        return _by_time(cold, warm, cold2)
    source = warm.cached_source
    enabled = Figure(
        "prefix caching",
        warm.cached_tokens > 0,
        "measured",
        f"the same {warm.prompt_tokens}-token prompt twice: {warm.cached_tokens} cached tokens "
        f"the second time ({source})",
    )
    identical = Figure(
        "reuse of an identical prompt",
        warm.cached_tokens,
        "measured",
        f"of {warm.prompt_tokens} prompt tokens (a server recomputes at least the last one)",
        "tokens",
    )
    points: list[dict[str, int]] = []
    for d in positions(longest):
        keep = d - rule.offset
        if keep < 1:
            continue
        prompt = [*base[:keep], words.other_than(base[keep]), *words.take(TAIL - 1)]
        a = client.complete(text(prompt), d + TAIL)
        points.append(
            {"position": d, "prompt_tokens": a.prompt_tokens, "cached": a.cached_tokens or 0}
        )
        step(f"prefix: diverge at token {d}")
    granularity = (
        granularity_of(points)
        if enabled.value
        else Figure("cache granularity", None, "not measurable", "prefix caching is off")
    )
    return PrefixResult(enabled, granularity, identical, points, source)


def granularity_of(points: list[dict[str, int]]) -> Figure:
    """The staircase's step: the gcd of the cached counts, checked against floor(d/P)xP."""
    cached = [p["cached"] for p in points]
    nonzero = sorted({c for c in cached if c > 0})
    if not nonzero:
        return Figure(
            "cache granularity", None, "not measurable",
            "no prompt diverging after a shared prefix found any of it cached",
        )  # fmt: skip
    step = 0
    for c in nonzero:
        step = math.gcd(step, c)
    fits = all(p["cached"] == (p["position"] // step) * step for p in points)
    lcp = all(p["cached"] == p["position"] for p in points)
    first, last = points[-1]["position"], points[0]["position"]
    span = f"{len(points)} divergence points from token {first} to {last}"
    if lcp:
        return Figure(
            "cache granularity", 1, "measured",
            f"cached = the divergence position at all {span}: the longest common prefix is "
            "reused token by token (no pages)",
            "token",
        )  # fmt: skip
    if fits and len(nonzero) >= 2:
        return Figure(
            "cache granularity", step, "measured",
            f"page size: cached = floor(position / {step}) x {step} at all {span}",
            "tokens (page)",
        )  # fmt: skip
    if fits:
        return Figure(
            "cache granularity", step, "inferred",
            f"only one step of the staircase was seen ({span}); the page is a multiple of "
            f"this, or the longest position is too short to see a second step",
            "tokens (page)",
        )  # fmt: skip
    return Figure(
        "cache granularity", step, "inferred",
        f"the cached counts are multiples of {step} but not floor(position / {step}) x "
        f"{step} everywhere ({span}); see the points",
        "tokens",
    )  # fmt: skip


def _by_time(cold: Answer, warm: Answer, cold2: Answer) -> PrefixResult:
    cold_ttft = min(cold.ttft, cold2.ttft)
    ratio = warm.ttft / cold_ttft if cold_ttft > 0 else math.nan
    on = ratio < 0.6
    note = (
        f"the server reports no cached tokens; inferred from TTFT: the repeated prompt took "
        f"{warm.ttft * 1e3:.1f} ms against {cold_ttft * 1e3:.1f} ms cold (ratio {ratio:.2f}; "
        "below 0.6 counts as on)"
    )
    return PrefixResult(
        Figure("prefix caching", on, "inferred", note),
        Figure("cache granularity", None, "not measurable",
               "needs a cached-token report (usage.prompt_tokens_details.cached_tokens)"),
        Figure("reuse of an identical prompt", None, "not measurable",
               "the server reports no cached tokens"),
    )  # fmt: skip
