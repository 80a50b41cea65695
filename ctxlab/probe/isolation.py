"""Does the isolation key isolate? `cache_salt` (vLLM's field, which `ctxlab serve` reads
too) is sent with one fresh prompt: salt A, salt A again (the control: the cache must
reuse it), then salt B and no salt. Isolation holds when the control reuses the prompt and
neither other request reuses a token of it. A server that ignores the field reuses it under
every salt: "this server does not isolate by cache_salt". A server that refuses the field
says so in its error, which is the finding.

This is a side-channel test when aimed at someone else's deployment: probe only servers you
operate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ctxlab.errors import CtxlabError
from ctxlab.probe.client import ProbeClient
from ctxlab.probe.figures import Figure
from ctxlab.probe.prompts import TokenRule, Words, text

LENGTH = 96  # tokens: several pages of any common page size


def planned() -> tuple[int, int]:
    return 4, 4 * LENGTH


@dataclass
class IsolationResult:
    isolates: Figure
    reused: dict[str, int | None]

    def figures(self) -> list[Figure]:
        return [self.isolates]


def measure(
    client: ProbeClient, words: Words, rule: TokenRule, nonce: int, step: Callable[[str], None]
) -> IsolationResult:
    prompt = text(words.take(rule.words_for(LENGTH)))
    salt_a, salt_b = f"ctxlab-probe-a-{nonce:x}", f"ctxlab-probe-b-{nonce:x}"
    try:
        client.complete(prompt, LENGTH, salt=salt_a)
    except CtxlabError as exc:
        if "cache_salt" in str(exc):
            return IsolationResult(
                Figure("cache_salt isolates", False, "measured",
                       f"the server refuses the cache_salt field: {exc}"),
                {},
            )  # fmt: skip
        raise
    step("isolation: salt A")
    control = client.complete(prompt, LENGTH, salt=salt_a).cached_tokens
    step("isolation: salt A again")
    other = client.complete(prompt, LENGTH, salt=salt_b).cached_tokens
    step("isolation: salt B")
    none = client.complete(prompt, LENGTH).cached_tokens
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
                   "the control (the same prompt and salt twice) reused nothing, so the cache "
                   "is off or refuses salted requests"),
            reused,
        )  # fmt: skip
    leaked = max(other or 0, none or 0)
    detail = (
        f"{LENGTH}-token prompt: {control} tokens reused under the same salt, {other} under "
        f"another salt, {none} without a salt"
    )
    if leaked == 0:
        return IsolationResult(Figure("cache_salt isolates", True, "measured", detail), reused)
    return IsolationResult(
        Figure("cache_salt isolates", False, "measured",
               f"this server does not isolate by cache_salt: {detail}"),
        reused,
    )  # fmt: skip
