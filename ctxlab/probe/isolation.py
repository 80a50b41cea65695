"""Does the isolation key isolate? `cache_salt` (vLLM's field, which `ctxlab serve` reads
too) is sent with one fresh prompt: salt A, salt A again (the control: the cache must
reuse it), then salt B and no salt. Isolation holds when the control reuses the prompt and
neither other request reuses a token of it. A server that ignores the field reuses it under
every salt: "this server does not isolate by cache_salt". A server that refuses the field
says so in its error, which is the finding.

The prompt is sized from the probed page (`reusable_tokens`: two whole pages plus a tail),
since a prompt shorter than one page is never reused on a paged cache (vLLM's CPU pages are
128 tokens) and the control would then say nothing.

This is a side-channel test when aimed at someone else's deployment: probe only servers you
operate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ctxlab.errors import CtxlabError
from ctxlab.probe.client import ProbeClient
from ctxlab.probe.figures import Figure
from ctxlab.probe.prompts import TokenRule, Words, reusable_tokens, text


def planned(page: int | None = None) -> tuple[int, int]:
    """(requests, prompt tokens); the page is not known before the prefix section, so the
    plan assumes `reusable_tokens(None)`'s page unless told."""
    return 4, 4 * reusable_tokens(page)


@dataclass
class IsolationResult:
    isolates: Figure
    reused: dict[str, int | None]

    def figures(self) -> list[Figure]:
        return [self.isolates]


def measure(
    client: ProbeClient,
    words: Words,
    rule: TokenRule,
    nonce: int,
    step: Callable[[str], None],
    page: int | None = None,
) -> IsolationResult:
    """`page`: the probed granularity (None where the prefix section did not resolve it)."""
    length = reusable_tokens(page)
    prompt = text(words.take(rule.words_for(length)))
    salt_a, salt_b = f"ctxlab-probe-a-{nonce:x}", f"ctxlab-probe-b-{nonce:x}"
    try:
        client.complete(prompt, length, salt=salt_a)
    except CtxlabError as exc:
        if "cache_salt" in str(exc):
            return IsolationResult(
                Figure("cache_salt isolates", False, "measured",
                       f"the server refuses the cache_salt field: {exc}"),
                {},
            )  # fmt: skip
        raise
    step("isolation: salt A")
    control = client.complete(prompt, length, salt=salt_a).cached_tokens
    step("isolation: salt A again")
    other = client.complete(prompt, length, salt=salt_b).cached_tokens
    step("isolation: salt B")
    none = client.complete(prompt, length).cached_tokens
    step("isolation: no salt")
    reused = {"same salt": control, "other salt": other, "no salt": none}
    if control is None:
        return IsolationResult(
            Figure("cache_salt isolates", None, "not measurable",
                   "the server reports no cached tokens"),
            reused,
        )  # fmt: skip
    if control == 0:
        return IsolationResult(
            Figure("cache_salt isolates", None, "not measurable",
                   f"the control (the same {length}-token prompt and salt twice) reused "
                   "nothing, so the cache is off or refuses salted requests"),
            reused,
        )  # fmt: skip
    leaked = max(other or 0, none or 0)
    detail = (
        f"{length}-token prompt: {control} tokens reused under the same salt, {other} under "
        f"another salt, {none} without a salt"
    )
    if leaked == 0:
        return IsolationResult(Figure("cache_salt isolates", True, "measured", detail), reused)
    return IsolationResult(
        Figure("cache_salt isolates", False, "measured",
               f"this server does not isolate by cache_salt: {detail}"),
        reused,
    )  # fmt: skip
