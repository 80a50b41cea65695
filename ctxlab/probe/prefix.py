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

Each prompt's length is checked against the server's own count: a prompt of a point at d is
d + TAIL tokens by the token rule, and a server that counts it otherwise (a probe word its
tokenizer splits: " hither" is two tokens on Gemma 3's, and without /tokenize calibration
cannot know) has placed that point somewhere else. Such a point is left out of the
granularity and of the figures past a sliding window (its position is unknown), kept in the
details with `placed: false`, and the figures say how many were left out and why.

Without a cached-token report the only evidence is time: the warm request's TTFT against a
cold one of the same length. That says "on" or "off" (inferred); granularity is then not
measurable.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

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
    misplaced: list[dict[str, int]] = field(default_factory=list)  # counted otherwise

    def figures(self) -> list[Figure]:
        return [self.enabled, self.granularity, self.identical_reuse]

    def left_out(self) -> str:
        """Why some points are not placed ("" when every one is)."""
        return left_out_note(len(self.misplaced), len(self.points) + len(self.misplaced))

    def staircase(self) -> list[dict[str, int | bool]]:
        """Every point, longest first, each with `placed` (False: the server counted its
        prompt at other than position + TAIL tokens, so its position is unknown)."""
        every = [{**p, "placed": True} for p in self.points]
        every += [{**p, "placed": False} for p in self.misplaced]
        return sorted(every, key=lambda p: -p["position"])


def left_out_note(misplaced: int, total: int) -> str:
    """The sentence a figure adds when `misplaced` of `total` points were left out."""
    if not misplaced:
        return ""
    return (
        f"{misplaced} of {total} divergence points left out: the server counted their prompts "
        f"at other than position + {TAIL} tokens (a probe word its tokenizer does not count as "
        "one token), so their positions are unknown"
    )


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
    misplaced: list[dict[str, int]] = []
    for d in positions(longest):
        keep = d - rule.offset
        if keep < 1:
            continue
        prompt = [*base[:keep], words.other_than(base[keep]), *words.take(TAIL - 1)]
        a = client.complete(text(prompt), d + TAIL)
        point = {"position": d, "prompt_tokens": a.prompt_tokens, "cached": a.cached_tokens or 0}
        (points if a.prompt_tokens == d + TAIL else misplaced).append(point)
        step(f"prefix: diverge at token {d}")
    left_out = left_out_note(len(misplaced), len(points) + len(misplaced))
    granularity = (
        granularity_of(points, left_out)
        if enabled.value
        else Figure("cache granularity", None, "not measurable", "prefix caching is off")
    )
    return PrefixResult(enabled, granularity, identical, points, source, misplaced)


def granularity_of(points: list[dict[str, int]], left_out: str = "") -> Figure:
    """The staircase's step: the gcd of the cached counts, checked against floor(d/P)xP.
    `left_out`: why some points are not among `points` (`left_out_note`), added to the note."""
    if points:
        fig = _granularity(points)
    else:
        fig = Figure("cache granularity", None, "not measurable", "no divergence point was placed")
    return replace(fig, note=f"{fig.note}; {left_out}") if left_out else fig


def _granularity(points: list[dict[str, int]]) -> Figure:
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
