"""What `ctxlab workshop --server` does for the demonstrations that need the engine itself.

- Demonstration 3 (page size): a server's page size cannot be changed from outside, so the
  run measures it instead: the probe's divergence staircase (`ctxlab.probe.prefix`) gives
  the server's reuse granularity, each divergence point's reused and recomputed tokens, and
  the rounding waste the granularity implies for the config's request lengths.
- Demonstration 4 (eviction) is sized to the server's probed cache instead of a pool
  (`server_eviction.py`).
"""

from __future__ import annotations

import math
import secrets

from ctxlab.probe import prefix
from ctxlab.probe.prompts import TokenRule, Words, check_rule, text
from ctxlab.workshop.catalog import BY_KEY
from ctxlab.workshop.result import Column, DemoResult, Table
from ctxlab.workshop.server_backend import ServerLLM
from ctxlab.workshop.session import Session


def not_measurable(key: str, reason: str) -> DemoResult:
    demo = BY_KEY[key]
    res = DemoResult(demo.number, demo.key, demo.title, "not measurable", "measured")
    res.summary = f"Not measurable through the server: {reason}."
    res.notes.append(res.summary)
    return res


def calibrate(server: ServerLLM) -> tuple[Words, TokenRule]:
    """Fresh words and the server's token rule for them (`ctxlab.probe.prompts`)."""
    words = Words(secrets.randbits(32))
    counts = {n: server.client.complete(text(words.take(n)), n).prompt_tokens for n in (48, 112)}
    return words, check_rule(counts, None)


def probe_page(server: ServerLLM, longest: int) -> prefix.PrefixResult:
    """The server's divergence staircase (`ctxlab probe`'s prefix section)."""
    words, rule = calibrate(server)
    return prefix.measure(server.client, words, rule, longest, lambda _m: None)


def page_size(session: Session, pre: prefix.PrefixResult) -> DemoResult:
    server = session.server
    demo = BY_KEY["page_size"]
    # Its predictions compare page sizes, which a server does not let a client choose: the
    # demonstration as configured is not measurable; what the server's page is, is.
    res = DemoResult(demo.number, demo.key, demo.title, "not measurable", "measured")
    g = pre.granularity
    page = g.value if isinstance(g.value, int) else None
    f = res.figures
    shown = (
        f"{f.say('server_page_tokens', page)} token(s)" if page else "not resolved"
    )  # fmt: skip
    points = f.say("divergence_points", len(pre.points))
    label = server.label(code=True)
    reuse = Table(
        "page_size_server_reuse", "storage",
        f"Demonstration 3: reuse after a divergence on {label}", "measured",
        [Column("diverges at token"), Column("prompt tokens"), Column("reused tokens"),
         Column("recomputed tokens")],
        note=f"reuse granularity {shown} ({g.how}), from {points} divergence points",
    )  # fmt: skip
    for p in pre.points:
        reuse.add(p["position"], p["prompt_tokens"], p["cached"], p["prompt_tokens"] - p["cached"])
    res.tables.append(reuse)
    if page:
        waste = Table(
            "page_size_server_waste", "storage",
            f"Demonstration 3: rounding the server's pages of {page} tokens implies ({label})",
            "measured",
            [Column("request tokens"), Column("slots allocated"), Column("waste %", 1)],
            note="slots = ceil(tokens / page) x page; the page size is the probed one",
        )  # fmt: skip
        for n in session.cfg.page_size.request_tokens:
            slots = math.ceil(n / page) * page
            waste.add(n, slots, 100 * (slots - n) / slots)
        res.tables.append(waste)
    reuse_rule = "d tokens" if page == 1 else f"floor(d / {page}) x {page} tokens"
    res.summary = (
        "Not measurable as configured: the comparison of page sizes needs pages a client "
        f"cannot set on a server. Measured instead: the server's reuse granularity is "
        f"{shown} ({g.how}); a prompt that diverges at token d reuses "
        + (reuse_rule if page else "an amount the staircase did not resolve")
        + " (tables above, in the storage results)."
    )
    res.notes.append(res.summary)
    return res
