"""Demonstration 1: change one early token and count what the prefix cache loses.

A prompt is sent cold, then again unchanged, then with one token changed at position 0, in
the middle, and at the first position of its last block, and once more unchanged under
another tenant's isolation key. A block's hash chains its parent's, so a change invalidates
its own block and every block after it: the miss is counted as reused and recomputed
tokens (not as hit requests: the middle change is still a "hit"), beside the TTFT it costs.
Each case is sent `repeats` times, round-robin over the cases, with a new token value each
time so no repeat can reuse another's blocks.

The file is in three parts: `measure` returns frozen records (`Records`, one `CaseRuns` per
case), `verdicts` records the observations the predictions are judged on (the one place it
judges), and the tables and prose are rendered from the records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from ctxlab.progress import Tracker
from ctxlab.workshop import latency_stats
from ctxlab.workshop.config import CommonConfig, Pos, Section, fits
from ctxlab.workshop.demonstration import Demonstration, FigureValues, Metric, Risk, ServerMode
from ctxlab.workshop.measure import Sent, median, send, spread
from ctxlab.workshop.result import Column, DemoResult, Gain, Table, fmt
from ctxlab.workshop.session import Session

Case = Literal["cold", "exact resend", "token 0", "middle", "last block", "other tenant"]
CASES: tuple[Case, ...] = ("token 0", "middle", "last block")


def steps(session: Session) -> int:
    return 1 + DEMO.config(session.cfg).repeats * (2 + len(CASES))


def positions(prompt_tokens: int, page: int) -> dict[Case, int]:
    """Where each case changes its token: 0, the middle, the first slot of the last block."""
    return {
        "token 0": 0,
        "middle": prompt_tokens // 2,
        "last block": (prompt_tokens - 1) // page * page,
    }


@dataclass(frozen=True)
class CaseRuns:
    """Every request of one case: token counts are the same in each, TTFTs are not."""

    case: Case
    position: int | None  # the changed token's position (None: nothing changed)
    sent: tuple[Sent, ...]

    @property
    def reused(self) -> int:
        return int(median([s.reused for s in self.sent]))

    @property
    def recomputed(self) -> int:
        return int(median([s.recomputed for s in self.sent]))

    @property
    def ttfts(self) -> list[float]:
        return [s.ttft_ms for s in self.sent]

    @property
    def ttft_ms(self) -> float:
        return median(self.ttfts)


@dataclass(frozen=True)
class Records:
    """What demonstration 1 measured; every table, verdict and sentence reads these."""

    prompt_tokens: int
    page: int
    cases: tuple[CaseRuns, ...]  # cold, exact resend, the changed cases, other tenant

    def __getitem__(self, case: Case) -> CaseRuns:
        return next(c for c in self.cases if c.case == case)


def measure(session: Session, tracker: Tracker) -> Records:
    """The cold send, then each case `repeats` times, round-robin (nothing formatted)."""
    cfg, page = DEMO.config(session.cfg), session.cfg.engine.page_size
    llm = session.requests.generator()
    base = session.text_ids(cfg.prompt_tokens)

    def go(ids: list[int], salt: str | None = None) -> Sent:
        sent = send(llm, ids, cfg.output_tokens, salt)
        tracker.advance()
        return sent

    runs: dict[Case, list[Sent]] = {"cold": [go(base)], "exact resend": []}
    where = positions(cfg.prompt_tokens, page)
    values = {case: base[where[case]] for case in CASES}
    runs.update({case: [] for case in CASES})
    runs["other tenant"] = []
    # Round-robin over the cases, so every case meets the machine's ups and downs alike.
    for i in range(cfg.repeats):
        runs["exact resend"].append(go(base))
        for case in CASES:
            values[case] = session.other_token(values[case])  # a new value: a new chain
            ids = list(base)
            ids[where[case]] = values[case]
            runs[case].append(go(ids))
        runs["other tenant"].append(go(base, salt=f"tenant-{i}"))
    resident = runs["cold"][0].resident_kv_bytes
    if resident is not None:
        session.note_resident("demonstration 1", resident, session.requests.slot_bytes(llm))
    cases = tuple(CaseRuns(k, where.get(k), tuple(v)) for k, v in runs.items())
    return Records(cfg.prompt_tokens, page, cases)


def verdicts(r: Records, res: DemoResult) -> None:
    """The metrics the run's predictions are judged on (`res.observe`): the one place this
    demonstration judges (`ctxlab.workshop.verdicts` reads them against the config)."""
    resend = r["exact resend"]
    noise = spread(resend.ttfts)
    for key, case in (("at_token0", "token 0"), ("mid", "middle"), ("last_block", "last block")):
        changed = r[case]
        res.observe(f"reused_tokens_{key}", resend.reused, changed.reused)
        res.observe(f"recomputed_tokens_{key}", resend.recomputed, changed.recomputed)
        res.observe_latency(f"ttft_ms_{key}", resend.ttfts, changed.ttfts, 1, noise)
    res.observe("reused_tokens_other_tenant", resend.reused, r["other tenant"].reused)


def run(session: Session, tracker: Tracker) -> DemoResult:
    """Measure, judge, then render the tables and prose from the records."""
    records = measure(session, tracker)
    res = DemoResult.of(DEMO, "run", "measured")
    verdicts(records, res)
    _tables(res, records)
    _explain(res, records)
    return res


def _tables(res: DemoResult, r: Records) -> None:
    storage = Table(
        "prefix_miss_storage",
        "storage",
        f"Demonstration 1: what the prefix cache served for a {r.prompt_tokens:,}-token prompt "
        f"(page {r.page})",
        "measured",
        [
            Column("case"),
            Column("changed position"),
            Column("reused tokens"),
            Column("recomputed tokens"),
            Column("hit request"),
        ],
        note="reused tokens: prompt tokens served by the prefix cache at admission; a hit "
        "request is any request that reused at least one token",
    )
    serving = Table(
        "prefix_miss_serving",
        "serving",
        "Demonstration 1: time to first token of each case",
        "measured",
        [
            Column("case"),
            Column("requests"),
            Column("TTFT median ms", 1),
            Column("TTFT median 95 % low", 1),
            Column("TTFT median 95 % high", 1),
            Column("TTFT min ms", 1),
            Column("TTFT max ms", 1),
        ],
        note="one request at a time on an otherwise idle engine, the cases taken in turn; "
        "cold is the first send; the median's 95 % interval is a bootstrap over the case's "
        "requests (ctxlab.stats), zero-wide for a single request",
    )
    for c in r.cases:
        pos = "none" if c.position is None else c.position
        storage.add(c.case, pos, c.reused, c.recomputed, "yes" if c.reused else "no")
        times = c.ttfts
        _, low, high = latency_stats.cells(times, 50)
        serving.add(c.case, len(c.sent), c.ttft_ms, low, high, min(times), max(times))
    res.tables += [storage, serving]


def _explain(res: DemoResult, r: Records) -> None:
    f = res.figures
    resend, token0, mid = r["exact resend"], r["token 0"], r["middle"]
    last, tenant = r["last block"], r["other tenant"]
    n = f.say("prompt_tokens", r.prompt_tokens)
    cold = f.say("ttft_cold_ms", r["cold"].ttft_ms, 1)
    res.summary = (
        f"A {n}-token prompt, cached, then sent with one token changed: reuse stops at the "
        "block that holds the change, whatever the rest of the prompt is."
    )
    res.gains.append(
        Gain(
            "an exact resend",
            f"the cache served {f.say('reused_exact', resend.reused)} of {n} prompt "
            f"tokens; {f.say('recomputed_exact', resend.recomputed)} were computed again "
            "(the last block, which is never shared, so the request still produces its own logits)",
            f"time to first token fell from {cold} ms cold to "
            f"{f.say('ttft_exact_ms', resend.ttft_ms, 1)} ms",
        )
    )
    res.gains.append(
        Gain(
            "a change at token 0 (a loss)",
            f"every block's hash chains from the first block, so one changed token in {n} left "
            f"{f.say('reused_token0', token0.reused)} tokens reusable and "
            f"{f.say('recomputed_token0', token0.recomputed)} recomputed",
            f"time to first token {f.say('ttft_token0_ms', token0.ttft_ms, 1)} ms against "
            f"{cold} ms cold: the change costs a full prefill",
        )
    )
    res.gains.append(
        Gain(
            "a change in the middle (a partial loss)",
            f"reuse stopped at the block holding position {f.say('pos_mid', mid.position)}: "
            f"{f.say('reused_mid', mid.reused)} tokens reused, "
            f"{f.say('recomputed_mid', mid.recomputed)} recomputed; counted in hit requests "
            "this request is a hit, which hides the recomputed half",
            f"time to first token {f.say('ttft_mid_ms', mid.ttft_ms, 1)} ms",
        )
    )
    res.gains.append(
        Gain(
            "a change in the last block",
            f"{f.say('reused_last', last.reused)} tokens reused, as many as the exact "
            "resend: the last block is recomputed in both",
            f"time to first token {f.say('ttft_last_ms', last.ttft_ms, 1)} ms against "
            f"{f.say('ttft_exact_ms', resend.ttft_ms, 1)} ms for the exact resend",
        )
    )
    res.gains.append(
        Gain(
            "isolation between tenants (a deliberate loss)",
            f"the same prompt under another tenant's cache_salt reused "
            f"{f.say('reused_tenant', tenant.reused)} tokens: the salt is folded into "
            "the first block's hash, so no block is shared across the isolation key",
            f"the other tenant waits {f.say('ttft_tenant_ms', tenant.ttft_ms, 1)} ms for "
            "its first token, the cold price, instead of learning from a fast answer that "
            "someone else sent the same prompt",
        )
    )
    where = positions(r.prompt_tokens, r.page)
    if where["middle"] // r.page == where["last block"] // r.page:
        # a server's page (vLLM's 128 on CPU) longer than the config assumed
        res.notes.append(
            f"The {f.say('prompt_tokens', r.prompt_tokens)}-token prompt holds too few "
            f"{f.say('page_tokens', r.page)}-token pages: the middle change and the last block "
            "fall in one page, so the two cases cannot differ here; set "
            f"prefix_miss.prompt_tokens to at least {f.say('least_prompt', 3 * r.page + 1)}."
        )


# -- declarations ---------------------------------------------------------------------------


class PrefixMissSection(Section):
    prompt_tokens: Annotated[int, Field(ge=8)]
    output_tokens: Pos
    repeats: Pos


_RESEND = "exact resend (warm)"
METRICS = (
    Metric(
        "reused_tokens_at_token0",
        "tokens",
        _RESEND,
        "token 0 changed",
        "prompt tokens served by the prefix cache when the first token differs",
    ),
    Metric(
        "reused_tokens_mid",
        "tokens",
        _RESEND,
        "middle token changed",
        "reused tokens when the token in the middle differs",
    ),
    Metric(
        "reused_tokens_last_block",
        "tokens",
        _RESEND,
        "last-block token changed",
        "reused tokens when a token of the last block differs",
    ),
    Metric(
        "recomputed_tokens_at_token0",
        "tokens",
        _RESEND,
        "token 0 changed",
        "prompt tokens computed again",
    ),
    Metric(
        "recomputed_tokens_mid",
        "tokens",
        _RESEND,
        "middle token changed",
        "prompt tokens computed again",
    ),
    Metric(
        "recomputed_tokens_last_block",
        "tokens",
        _RESEND,
        "last-block token changed",
        "prompt tokens computed again",
    ),
    Metric("ttft_ms_at_token0", "ms", _RESEND, "token 0 changed", "time to first token"),
    Metric("ttft_ms_mid", "ms", _RESEND, "middle token changed", "time to first token"),
    Metric("ttft_ms_last_block", "ms", _RESEND, "last-block token changed", "time to first token"),
    Metric(
        "reused_tokens_other_tenant",
        "tokens",
        _RESEND,
        "same prompt, other tenant's cache_salt",
        "reuse across an isolation key (must be none)",
    ),
)

TOML = """\
# -- 1: change one early token ---------------------------------------------------------------
[prefix_miss]
prompt_tokens = 1024          # one prompt, cached, then sent again with one token changed
output_tokens = 4
repeats = 3                   # each case is sent this many times (a new token value each time)
"""

PREDICTIONS_TOML = """\
[predictions.prefix_miss]     # baseline: the same prompt sent again unchanged (warm)
reused_tokens_at_token0 = { direction = "down", range = [0, 0] }
reused_tokens_mid = { direction = "down", range = [512, 512] }
reused_tokens_last_block = { direction = "unchanged", tolerance = 0.0 }
recomputed_tokens_at_token0 = { direction = "up", range = [1024, 1024] }
ttft_ms_at_token0 = { direction = "up" }
ttft_ms_mid = { direction = "up" }
# 16 tokens computed on both sides; single TTFTs of ~150 ms scatter widely on a shared CPU
ttft_ms_last_block = { direction = "unchanged", tolerance = 1.0 }
reused_tokens_other_tenant = { direction = "down", range = [0, 0] }
"""

QUICK_TOML = """\
[quick.prefix_miss]
prompt_tokens = 512           # three whole pages and more of a server's 128 (vLLM on CPU);
                              # the middle, token 256, starts a page of every size up to 256

[quick.predictions.prefix_miss]
reused_tokens_at_token0 = { direction = "down", range = [0, 0] }
reused_tokens_mid = { direction = "down", range = [256, 256] }
reused_tokens_last_block = { direction = "unchanged", tolerance = 0.0 }
recomputed_tokens_at_token0 = { direction = "up", range = [512, 512] }
ttft_ms_at_token0 = { direction = "up" }
reused_tokens_other_tenant = { direction = "down", range = [0, 0] }
"""


def check(pm: PrefixMissSection, cfg: CommonConfig) -> None:
    fits(cfg, "prefix_miss.prompt_tokens", pm.prompt_tokens + pm.output_tokens, pool=True)


def _guard_hit_requests(f: FigureValues) -> tuple[str, str]:
    return "guarded", (
        f"reuse is counted in tokens: in demonstration {DEMO.number} the middle change is a hit "
        f"request that reused {fmt(f['reused_mid'])} tokens and recomputed "
        f"{fmt(f['recomputed_mid'])}"
    )


def _guard_tenants(f: FigureValues) -> tuple[str, str]:
    return "guarded", (
        f"demonstration {DEMO.number} sent the same prompt under another tenant's cache_salt: "
        f"it reused {fmt(f['reused_tenant'])} tokens"
    )


DEMO = Demonstration(
    number=1,
    key="prefix_miss",
    title="Change one early token",
    section=PrefixMissSection,
    metrics=METRICS,
    layers=("storage", "serving"),
    steps=steps,
    run=run,
    toml=TOML,
    predictions_toml=PREDICTIONS_TOML,
    quick_toml=QUICK_TOML,
    guards=((Risk.HIT_REQUESTS, _guard_hit_requests), (Risk.TENANTS, _guard_tenants)),
    check=check,
    required=("reused_tokens_at_token0", "reused_tokens_mid", "ttft_ms_at_token0"),
    server=ServerMode(through=True, needs_cached_tokens=True),
)
