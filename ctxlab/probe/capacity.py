"""How many tokens of prefix the cache keeps before it evicts.

A sentinel prompt S (exact pages) is cached; then fresh filler prompts totalling T tokens
(whole pages, one output token each) are sent, and S is sent again with one new word: its
cached tokens say how much of S survived. A paged cache that evicts least-recently-used
blocks and frees a finished request's tail first (vLLM, `ctxlab serve`) loses S from its
end, so a partial hit of c tokens means the cache held c + T tokens: capacity to the page.
Re-sending S also makes it the newest again, so each trial needs no fresh sentinel.

T doubles until S is lost (or only partly kept), then is bisected until a partial hit
shows or the bracket is one page wide. A token-granular cache (page 1) may keep whole
prompts instead of pages (llama.cpp's slots: a prompt stays whole or goes, and what counts
is how many other prompts came since, not their tokens), so there the fillers are prompts
of a fixed size and the count k is doubled and bisected: the sentinel survives k fillers
and is lost after k + 1, i.e. the cache keeps about k + 1 prompts (k x size + S tokens);
reported as inferred, with both readings.

Where the server publishes its pool (vLLM's and `ctxlab serve`'s `cache_config_info`:
num_gpu_blocks x block_size), the figure is confirmed instead of searched: the first trial
fills the published pool less half a sentinel, so a cache of the published size shows a
partial hit at once; a whole or lost sentinel moves the window by one sentinel, at most
CONFIRM_TRIALS times. A blind doubling search of a 2M-token cache would not finish.

Every filler evicts other users' cached prefixes: this is why the probe warns before it
starts. The section stops at the run's budget and reports what it
proved so far (a lower bound).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ctxlab.probe.client import BudgetSpent, ProbeClient
from ctxlab.probe.figures import Figure
from ctxlab.probe.prompts import TokenRule, Words, text

MAX_TRIALS = 24
CONFIRM_TRIALS = 4  # fills when confirming a published pool


@dataclass
class CapacityResult:
    capacity: Figure
    trials: list[dict[str, int]] = field(default_factory=list)

    def figures(self) -> list[Figure]:
        return [self.capacity]


def _round(n: int, page: int) -> int:
    return max(page, n // page * page)


def measure(
    client: ProbeClient,
    words: Words,
    rule: TokenRule,
    page: int,
    max_len: int,
    step: Callable[[str], None],
    sentinel_pages: int = 8,
    start: int | None = None,
    published: int | None = None,
) -> CapacityResult:
    """`page`: the probed granularity (1 for token-granular caches); `max_len`: the longest
    prompt the server takes (fillers stay at or below half of it); `published`: the pool in
    tokens the server's metrics state, confirmed with at most CONFIRM_TRIALS fills."""
    unit = max(1, page)
    if unit == 1:
        return _by_prompts(client, words, rule, step)
    s_len = _round(max(128, sentinel_pages * unit), unit)
    chunk_cap = _round(min(max_len // 2, 4096), unit)
    sentinel = words.take(rule.words_for(s_len))
    trials: list[dict[str, int]] = []
    client.complete(text(sentinel), s_len)
    step("capacity: sentinel")
    lo, hi = 0, None  # S fully kept after lo filler tokens; lost after hi

    def trial(total: int) -> int:
        chunk = min(chunk_cap, _round(max(unit, total // 4), unit))
        left = total
        while left > 0:
            n = min(chunk, left)
            client.complete(text(words.take(rule.words_for(n))), n)
            left -= n
        again = sentinel + words.take(1)
        got = client.complete(text(again), s_len + 1).cached_tokens or 0
        trials.append({"filler_tokens": total, "sentinel_cached": got})
        step(f"capacity: {total:,} filler tokens, sentinel kept {got}")
        return got

    if published is not None and published > s_len:
        return _confirm(trial, trials, published, s_len, unit)
    total = start or s_len
    try:
        for _ in range(MAX_TRIALS):
            got = trial(total)
            if 0 < got < s_len:
                return CapacityResult(
                    Figure(
                        "prefix-cache capacity", got + total, "measured",
                        f"after {total:,} filler tokens the {s_len}-token sentinel kept "
                        f"{got} cached tokens: the cache held {got} + {total:,} tokens",
                        "tokens",
                    ),
                    trials,
                )  # fmt: skip
            if got >= s_len:
                lo = total
            else:
                hi = total
            if hi is None:
                total *= 2
            else:
                if hi - lo <= unit:
                    break
                total = _round(lo + (hi - lo) // 2, unit)
                if total <= lo:
                    break
    except BudgetSpent:
        pass
    return CapacityResult(_bracket(lo, hi, s_len, unit), trials)


def _confirm(
    trial: Callable[[int], int], trials: list[dict[str, int]], published: int, s_len: int, unit: int
) -> CapacityResult:
    """Fill the published pool less half a sentinel; slide by a sentinel until a partial hit."""
    total = _round(published - s_len // 2, unit)
    lo, hi = 0, None
    spent = False
    try:
        for _ in range(CONFIRM_TRIALS):
            got = trial(total)
            if 0 < got < s_len:
                held = got + total
                off = held - published
                return CapacityResult(
                    Figure(
                        "prefix-cache capacity", held, "measured",
                        f"confirms the published {published:,} tokens "
                        f"({'within one page' if abs(off) <= unit else f'{off:+,} tokens off'}): "
                        f"after {total:,} filler tokens the {s_len}-token sentinel kept {got} "
                        f"cached tokens, so the cache held {got} + {total:,}",
                        "tokens",
                    ),
                    trials,
                )  # fmt: skip
            if got >= s_len:
                lo, total = total, total + s_len - unit
            else:
                hi, total = total, max(unit, total - s_len + unit)
                if hi <= unit:
                    break
    except BudgetSpent:
        spent = True
    low = f"at least {lo + s_len:,}" if lo else ""
    high = f"at most {hi + s_len:,}" if hi is not None else ""
    value = f"{lo + s_len:,}-{hi + s_len:,}" if lo and hi is not None else None
    return CapacityResult(
        Figure(
            "prefix-cache capacity", value or (lo + s_len if lo else None), "inferred",
            f"the published {published:,} tokens were not confirmed within {len(trials)} "
            f"fill{'s' if len(trials) != 1 else ''} "
            + (
                "(the budget, --max-requests / --max-tokens / --max-seconds, ran out)"
                if spent
                else f"(no partial hit of the {s_len}-token sentinel)"
            )
            + ": the cache holds "
            f"{' and '.join(x for x in (low, high) if x) or 'an unknown number of'} tokens",
            "tokens",
        ),
        trials,
    )  # fmt: skip


def _bracket(lo: int, hi: int | None, s_len: int, unit: int) -> Figure:
    if hi is None:
        return Figure(
            "prefix-cache capacity", lo + s_len if lo else None, "inferred",
            f"a lower bound: the sentinel was still fully cached after {lo:,} filler tokens "
            "when the budget (--max-requests / --max-tokens / --max-seconds) ran out",
            "tokens (at least)",
        )  # fmt: skip
    return Figure(
        "prefix-cache capacity", f"{lo + s_len:,}-{hi + s_len:,}", "inferred",
        f"the {s_len}-token sentinel survived {lo:,} filler tokens whole and was lost after "
        f"{hi:,}; no partial hit was seen (the cache keeps or drops whole prompts)",
        "tokens",
    )  # fmt: skip


FILLER = 64  # tokens of each filler prompt when counting prompts


def _by_prompts(
    client: ProbeClient, words: Words, rule: TokenRule, step: Callable[[str], None]
) -> CapacityResult:
    s_len = 128
    sentinel = words.take(rule.words_for(s_len))
    trials: list[dict[str, int]] = []
    client.complete(text(sentinel), s_len)
    step("capacity: sentinel")

    def kept_after(k: int) -> bool:
        for _ in range(k):
            client.complete(text(words.take(rule.words_for(FILLER))), FILLER)
        got = client.complete(text(sentinel + words.take(1)), s_len + 1).cached_tokens or 0
        trials.append({"filler_prompts": k, "sentinel_cached": got})
        step(f"capacity: {k} filler prompts, sentinel kept {got}")
        return got >= s_len

    lo, hi, k = 0, None, 1
    try:
        while hi is None:
            if kept_after(k):
                lo, k = k, 2 * k
            else:
                hi = k
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if kept_after(mid):
                lo = mid
            else:
                hi = mid
    except BudgetSpent:
        pass
    if hi is None:
        return CapacityResult(
            Figure(
                "prefix-cache capacity", f"{lo + 1} prompts (at least)", "inferred",
                f"the {s_len}-token sentinel was still cached after {lo} filler prompts of "
                f"{FILLER} tokens ({lo * FILLER + s_len:,} tokens in all) when the budget ran out",
            ),
            trials,
        )  # fmt: skip
    return CapacityResult(
        Figure(
            "prefix-cache capacity", f"{lo + 1} prompts", "inferred",
            f"the {s_len}-token sentinel survived {lo} filler prompts of {FILLER} tokens and "
            f"was lost after {hi}: the cache keeps about {lo + 1} prompts (by slot or LRU), "
            f"{lo * FILLER + s_len:,}-{hi * FILLER + s_len:,} tokens if it counts tokens",
        ),
        trials,
    )  # fmt: skip
