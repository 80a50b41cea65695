"""Demonstration 3: page size sets rounding waste and reuse granularity, not bytes per token.

For each page size an engine holds a set of requests at once (prefix cache off, so nothing
is shared) and the pool's own counters give the slots allocated: waste = allocated - held,
next to the planner's `paged_request` prediction for the same lengths. Then two prompts
identical up to a position that is not a page multiple go through an engine with the cache
on: only whole pages before the divergence are reused, next to the planner's full-page
sharing figure. The bytes one token slot costs are read from the pool at every page size.

The pair is sent `repeats` times per page size (new text each time), so the diverging
prompt's TTFT is a median with its n and bootstrap interval, and the change from the
smallest to each larger page is read against its own interval (`latency_stats`): slots,
bytes and reused tokens are exact counts (the same in every repeat), TTFTs are not.

The file is in three parts: `measure` returns frozen records (`Records`, one `PageRow` per
page size), `verdicts` records
the observations and judges each page's TTFT change (the one place it judges), and the
tables, prose and plot are rendered from the records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, model_validator

from ctxlab.plan.paging import paged_request
from ctxlab.plan.sharing import prefix_sharing
from ctxlab.progress import Tracker
from ctxlab.stats import Direction
from ctxlab.workshop import latency_stats
from ctxlab.workshop.config import CommonConfig, Pos, Section, fits
from ctxlab.workshop.demonstration import (
    Demonstration,
    FigureValues,
    Metric,
    Plot,
    Risk,
    ServerMode,
)
from ctxlab.workshop.measure import median, send
from ctxlab.workshop.result import Column, DemoResult, Figures, Gain, Table, fmt
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from ctxlab.workshop.server_findings import ServerRun


def steps(session: Session) -> int:
    c = DEMO.config(session.cfg)
    return (1 + c.repeats) * len(c.page_sizes)


@dataclass(frozen=True)
class Held:
    """Every request of one mix resident in one pool at once: the pool's own counters."""

    held: int  # tokens the requests hold
    allocated: int  # token slots the pool gave them
    resident_bytes: int


@dataclass(frozen=True)
class Pair:
    """Prompt A then B (A's first tokens, then other text): B's reuse and both TTFTs."""

    ttft_first_ms: float
    ttft_ms: float
    reused: int
    recomputed: int


@dataclass(frozen=True)
class PageRow:
    """One page size: the pool with every request resident, the diverging pairs, and the
    planner's figures for the same lengths."""

    page: int
    held: int
    allocated: int
    resident_bytes: int
    per_token: int  # the planner's bytes per token
    ttft_first: tuple[float, ...]  # the first prompt of each pair (cold)
    ttft: tuple[float, ...]  # the diverging prompt of each pair
    reused: int  # the same in every pair (the pool's rule, not a timing)
    recomputed: int
    waste_plan: int
    waste_bytes_plan: int
    reused_plan: int

    @property
    def slot_bytes(self) -> float:
        return self.resident_bytes / self.allocated

    @property
    def waste(self) -> int:
        return self.allocated - self.held

    @property
    def waste_bytes(self) -> int:
        return self.resident_bytes - self.held * self.per_token

    @property
    def ttft_first_ms(self) -> float:
        return median(self.ttft_first)

    @property
    def ttft_ms(self) -> float:
        return median(self.ttft)


@dataclass(frozen=True)
class Records:
    """What demonstration 3 measured, one row per page size in the config's (increasing)
    order; every table, verdict and sentence reads these."""

    rows: tuple[PageRow, ...]

    @property
    def lo(self) -> PageRow:
        return self.rows[0]

    @property
    def hi(self) -> PageRow:
        return self.rows[-1]


def held_at_once(session: Session, page: int, lengths: list[int]) -> Held:
    """Hold every request of `lengths` in one pool at once; read the pool's counters."""
    from ctxlab.engine import SamplingParams

    slots = sum(-(-n // page) * page for n in lengths)
    llm = session.llm(
        page_size=page,
        pool_tokens=slots + 4 * page + 64,
        max_num_batched_tokens=sum(lengths),
        max_num_seqs=len(lengths),
        prefix_caching=False,
    )
    engine = llm.engine
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    rids = [engine.add_request(session.text_ids(n), params) for n in lengths]
    engine.step()  # one step prefills every prompt: all of them are resident now
    live = [engine.seqs[r] for r in rids]
    if any(s.num_computed < s.num_prompt for s in live):
        raise RuntimeError("the page-size measurement did not prefill every prompt in one step")
    st = engine.stats()
    engine.run_all(rids)
    allocated = st.blocks_used * page // engine.kv.n_lanes
    return Held(sum(lengths), allocated, st.resident_bytes)


def diverging_pair(session: Session, page: int, pair: int, at: int) -> Pair:
    """Send prompt A, then B = A's first `at` tokens + other text: what B reuses (new text
    every call, so no earlier pair is in the cache)."""
    llm = session.llm(page_size=page, pool_tokens=2 * pair + 4 * page + 64)
    a = session.text_ids(pair)
    b = a[:at] + session.text_ids(pair - at)
    if b[at] == a[at]:
        b[at] = session.other_token(a[at])
    first = send(llm, a, 1)
    second = send(llm, b, 1)
    return Pair(first.ttft_ms, second.ttft_ms, second.reused, second.recomputed)


def measure(session: Session, tracker: Tracker) -> Records:
    """Every page size: the resident mix, the pairs, the planner beside them (nothing
    formatted)."""
    cfg = DEMO.config(session.cfg)
    arch = session.arch()
    per_token = arch.kv_bytes_per_token()
    rows = []
    for page in cfg.page_sizes:
        held = held_at_once(session, page, cfg.request_tokens)
        tracker.advance()
        pairs = []
        for _ in range(cfg.repeats):
            pairs.append(diverging_pair(session, page, cfg.pair_tokens, cfg.divergence_at))
            tracker.advance()
        planned = [paged_request(arch, n, page) for n in cfg.request_tokens]
        share = prefix_sharing(arch, cfg.pair_tokens, 2, cfg.divergence_at, page)
        rows.append(
            PageRow(
                page=page,
                held=held.held,
                allocated=held.allocated,
                resident_bytes=held.resident_bytes,
                per_token=per_token,
                ttft_first=tuple(p.ttft_first_ms for p in pairs),
                ttft=tuple(p.ttft_ms for p in pairs),
                reused=int(median([p.reused for p in pairs])),
                recomputed=int(median([p.recomputed for p in pairs])),
                waste_plan=sum(p.wasted_tokens for p in planned),
                waste_bytes_plan=sum(p.wasted_bytes for p in planned),
                reused_plan=min(
                    share.bytes_avoided_full_pages // per_token,
                    (cfg.pair_tokens - 1) // page * page,
                ),
            )
        )
    return Records(tuple(rows))


@dataclass(frozen=True)
class Judged:
    """The TTFT prediction and each page's change against the smallest (None for it)."""

    direction: Direction
    tolerance: float
    changes: tuple[latency_stats.Compared | None, ...]


def verdicts(session: Session, records: Records, res: DemoResult) -> Judged:
    """The metrics the run's predictions are judged on (`res.observe`), and each page's
    TTFT change against the smallest judged against the prediction: the one place this
    demonstration judges."""
    rows, lo, hi = records.rows, records.lo, records.hi
    res.observe("waste_tokens", lo.waste, hi.waste)
    res.observe(
        "waste_tokens_vs_planner", sum(r.waste_plan for r in rows), sum(r.waste for r in rows)
    )
    res.observe("bytes_per_token_slot", lo.slot_bytes, hi.slot_bytes)
    res.observe("reused_tokens_at_divergence", lo.reused, hi.reused)
    res.observe(
        "reused_tokens_vs_planner", sum(r.reused_plan for r in rows), sum(r.reused for r in rows)
    )
    direction, tol = _predicted(session)
    moved = _compare(lo, hi, direction, tol)
    res.observe(
        "ttft_ms_after_divergence", lo.ttft_ms, hi.ttft_ms, 1, change=moved.change, test=moved.test
    )
    changes = tuple(None if r is lo else _compare(lo, r, direction, tol) for r in rows)
    return Judged(direction, tol, changes)


def run(session: Session, tracker: Tracker) -> DemoResult:
    """Measure, judge, then render tables, prose and the plot from the records."""
    records = measure(session, tracker)
    res = DemoResult.of(DEMO, "run", "measured")
    judged = verdicts(session, records, res)
    _tables(session, res, records.rows, judged)
    _explain(session, res, records.rows, judged)
    rows = records.rows
    res.plots.append(
        draw(
            [r.page for r in rows],
            [r.waste for r in rows],
            [r.waste_plan for r in rows],
            [r.reused for r in rows],
            [r.reused_plan for r in rows],
            DEMO.plot("3_page_size.png").path(session.out),
        )
    )
    return res


def _tables(session: Session, res: DemoResult, rows: tuple[PageRow, ...], judged: Judged) -> None:
    cfg = DEMO.config(session.cfg)
    lengths = ", ".join(f"{n:,}" for n in cfg.request_tokens)
    waste = Table(
        "page_size_waste",
        "storage",
        f"Demonstration 3: rounding waste with requests of {lengths} tokens held at once",
        "measured",
        [
            Column("page size"),
            Column("requests"),
            Column("held tokens"),
            Column("allocated slots (pool)"),
            Column("waste tokens (pool)"),
            Column("waste tokens (planner)"),
            Column("waste MiB (pool)", 3),
            Column("waste MiB (planner)", 3),
            Column("bytes per token slot (pool)"),
        ],
        note="pool: blocks in use x page size / lanes, with every request resident; planner: "
        "ctxlab.plan.paging.paged_request for the same lengths; exact counts (no sampling "
        "noise), over the requests in the requests column",
    )
    reuse = Table(
        "page_size_reuse",
        "storage",
        f"Demonstration 3: reuse when two {cfg.pair_tokens:,}-token prompts diverge at token "
        f"{cfg.divergence_at:,}",
        "measured",
        [
            Column("page size"),
            Column("pairs sent"),
            Column("reused tokens (engine)"),
            Column("reused tokens (planner)"),
            Column("shared tokens recomputed"),
        ],
        note="planner: ctxlab.plan.sharing.prefix_sharing's full-page saving, in tokens; "
        "exact counts, the same in every pair",
    )
    serving = Table(
        "page_size_serving",
        "serving",
        "Demonstration 3: time to first token of the pair per page size (medians of "
        f"{cfg.repeats} pairs)",
        "measured",
        [
            Column("page size"),
            Column("pairs"),
            Column("first prompt TTFT median ms (cold)", 1),
            Column("diverging prompt TTFT median ms", 1),
            Column("95 % low", 1),
            Column("95 % high", 1),
            Column(f"change vs page {rows[0].page} ms", 1),
            Column("change 95 % low", 1),
            Column("change 95 % high", 1),
            Column("predicted"),
            Column("verdict"),
            Column("tokens computed for it"),
        ],
        note="95 % intervals: bootstrap of the median over the pairs, and of the difference "
        f"of medians against page {rows[0].page} (each side resampled on its own; "
        "ctxlab.stats); predicted: the run's prediction for ttft_ms_after_divergence (or up, "
        "no tolerance: larger pages recompute more); verdict: held when the whole interval "
        "of the change lies past the tolerance on the predicted side, failed when wholly on "
        "the other, otherwise within noise",
    )
    base = rows[0]
    direction, tol = judged.direction, judged.tolerance
    said = direction + (f" (tolerance {100 * tol:g}%)" if tol else "")
    for r, c in zip(rows, judged.changes, strict=True):
        waste.add(
            r.page,
            len(cfg.request_tokens),
            r.held,
            r.allocated,
            r.waste,
            r.waste_plan,
            r.waste_bytes / 2**20,
            r.waste_bytes_plan / 2**20,
            round(r.slot_bytes),
        )
        reuse.add(
            r.page,
            cfg.repeats,
            r.reused,
            r.reused_plan,
            cfg.divergence_at - r.reused,
        )
        _, low, high = latency_stats.cells(r.ttft, 50)
        if r is base or c is None:
            change: tuple = (None, None, None, None, "baseline")
        else:
            change = (c.change.value, c.change.low, c.change.high, said, c.verdict)
        serving.add(
            r.page,
            len(r.ttft),
            r.ttft_first_ms,
            r.ttft_ms,
            low,
            high,
            *change,
            r.recomputed,
        )
    res.tables += [waste, reuse, serving]


def _predicted(session: Session) -> tuple[Direction, float]:
    predictions = session.cfg.predictions.get("page_size", {})
    return latency_stats.predicted(predictions, "ttft_ms_after_divergence", "up")


def _compare(lo: PageRow, hi: PageRow, direction: Direction, tol: float) -> latency_stats.Compared:
    """The diverging prompt's median TTFT at `hi`'s page against `lo`'s (separate repeats)."""
    return latency_stats.compare(
        list(lo.ttft), list(hi.ttft), 50, direction, False, tol * lo.ttft_ms
    )


def _change_words(f: Figures, c: latency_stats.Compared) -> str:
    """'12.3 ms [4.0, 20.1] (held)': the largest page's TTFT change against the smallest."""
    return (
        f"{f.say('ttft_change_ms', c.change.value, 1)} ms "
        f"[{f.say('ttft_change_low_ms', c.change.low, 1)}, "
        f"{f.say('ttft_change_high_ms', c.change.high, 1)}] ({c.verdict})"
    )


def _last_change(rows: tuple[PageRow, ...], judged: Judged) -> latency_stats.Compared:
    """The largest page against the smallest (computed afresh when only one page ran)."""
    last = judged.changes[-1]
    if last is None:
        return _compare(rows[0], rows[-1], judged.direction, judged.tolerance)
    return last


def _explain(session: Session, res: DemoResult, rows: tuple[PageRow, ...], judged: Judged) -> None:
    f = res.figures
    cfg = DEMO.config(session.cfg)
    lo, hi = rows[0], rows[-1]
    pool = session.cfg.engine.kv_pool_tokens
    fit_lo = pool // (lo.allocated // len(cfg.request_tokens) or 1)
    fit_hi = pool // (hi.allocated // len(cfg.request_tokens) or 1)
    small, large = f.say("page_small", lo.page), f.say("page_large", hi.page)
    res.summary = (
        "Page size changes how many slots a request holds and how much of a shared prefix "
        "can be reused; it does not change what one token slot costs."
    )
    res.gains.append(
        Gain(
            "smaller pages (less rounding waste)",
            f"at page {small} the requests held {f.say('allocated_small', lo.allocated)} slots "
            f"for {f.say('held', lo.held)} tokens; at page {large} they held "
            f"{f.say('allocated_large', hi.allocated)}, wasting "
            f"{f.say('waste_large', hi.waste)} slots "
            f"({f.say('waste_large_mib', hi.waste_bytes / 2**20, 3)} MiB); each slot costs "
            f"{f.say('slot_bytes', round(lo.slot_bytes))} bytes at every page size",
            f"a pool of {f.say('pool_tokens', pool)} tokens holds "
            f"{f.say('fit_small', fit_lo)} requests of this mix's mean size at page {small} and "
            f"{f.say('fit_large', fit_hi)} at page {large}: waste is concurrency lost",
        )
    )
    res.gains.append(
        Gain(
            "smaller pages (finer reuse)",
            f"the second prompt shared {f.say('divergence_at', cfg.divergence_at)} tokens with the "
            f"first; page {small} reused {f.say('reused_small', lo.reused)} of them, page "
            f"{large} {f.say('reused_large', hi.reused)}: a page is reused whole or not at all",
            "the diverging prompt's first token took (median of "
            f"{f.say('pairs', len(lo.ttft))} pairs) "
            f"{f.say('ttft_small_ms', lo.ttft_ms, 1)} ms "
            f"at page {small} and {f.say('ttft_large_ms', hi.ttft_ms, 1)} ms at page {large}, "
            f"a change of {_change_words(f, _last_change(rows, judged))} (the smallest "
            "pages also pay for one hash and one block per few tokens)",
        )
    )
    res.notes.append(
        "Paging is an allocation choice: the bytes per token slot column is the same at every "
        "page size, so no saving here is a smaller token; it is fewer empty slots or more "
        "shared ones."
    )


def draw(
    pages: list[int],
    measured: list[int],
    planned: list[int],
    reused: list[int],
    reused_plan: list[int],
    path: Path,
) -> Path:
    """Rounding waste and reuse at a divergence, measured (dots) against the planner (line)."""
    from ctxlab.workshop.plots import figure, save

    fig, (left, right) = figure()
    left.plot(pages, planned, "-", color="grey", label="planner")
    left.plot(pages, measured, "o", label="measured (pool)")
    left.set_xscale("log", base=2)
    left.set_xlabel("page size (tokens)")
    left.set_ylabel("wasted token slots")
    left.set_title("rounding waste")
    right.plot(pages, reused_plan, "-", color="grey", label="planner")
    right.plot(pages, reused, "o", label="measured")
    right.set_xscale("log", base=2)
    right.set_xlabel("page size (tokens)")
    right.set_ylabel("reused tokens")
    right.set_title("reuse at a divergence")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)


# -- declarations ---------------------------------------------------------------------------


class PageSizeSection(Section):
    page_sizes: list[Pos] = Field(min_length=2)
    request_tokens: list[Pos] = Field(min_length=1)
    pair_tokens: Annotated[int, Field(ge=2)]
    divergence_at: Pos
    repeats: Annotated[int, Field(ge=3)] = 3  # diverging pairs per page size (TTFT's n)

    @model_validator(mode="after")
    def _shape(self) -> PageSizeSection:
        if sorted(set(self.page_sizes)) != self.page_sizes:
            raise ValueError("page_sizes must be distinct and in increasing order")
        if self.divergence_at >= self.pair_tokens:
            raise ValueError(
                f"divergence_at {self.divergence_at} must fall inside the pair's "
                f"{self.pair_tokens} tokens"
            )
        if all(self.divergence_at % p == 0 for p in self.page_sizes):
            raise ValueError(
                f"divergence_at {self.divergence_at} is a multiple of every page size, so it "
                "cannot show reuse granularity"
            )
        return self


_SMALL, _LARGE = "smallest page size", "largest page size"
METRICS = (
    Metric(
        "waste_tokens",
        "tokens",
        _SMALL,
        _LARGE,
        "page-rounding waste over the request set, measured from the pool",
    ),
    Metric(
        "waste_tokens_vs_planner",
        "tokens",
        "planner's prediction (all page sizes)",
        "measured from the pool (all page sizes)",
        "total rounding waste",
    ),
    Metric(
        "bytes_per_token_slot",
        "bytes",
        _SMALL,
        _LARGE,
        "pool bytes of one token slot over all layers and KV heads",
    ),
    Metric(
        "reused_tokens_at_divergence",
        "tokens",
        _SMALL,
        _LARGE,
        "tokens reused by a prompt "
        "that diverges from a cached one at a position that is not a page multiple",
    ),
    Metric(
        "reused_tokens_vs_planner",
        "tokens",
        "planner: full pages before the divergence (all page sizes)",
        "measured (all page sizes)",
        "reuse granularity",
    ),
    Metric(
        "ttft_ms_after_divergence",
        "ms",
        _SMALL,
        _LARGE,
        "time to first token of the diverging prompt",
    ),
)

TOML = """\
# -- 3: page size ----------------------------------------------------------------------------
[page_size]
page_sizes = [1, 16, 64, 256]
request_tokens = [100, 300, 700]   # requests held at once; waste = allocated - held slots
pair_tokens = 1200            # two prompts of this length ...
divergence_at = 1000          # ... identical up to this token (not a multiple of most pages)
repeats = 3                   # pairs sent per page size: the TTFT median's sample
"""

PREDICTIONS_TOML = """\
[predictions.page_size]       # baseline: smallest page; observed: largest page
waste_tokens = { direction = "up" }
waste_tokens_vs_planner = { direction = "unchanged", tolerance = 0.0 }
bytes_per_token_slot = { direction = "unchanged", tolerance = 0.0 }
reused_tokens_at_divergence = { direction = "down", range = [768, 768] }
reused_tokens_vs_planner = { direction = "unchanged", tolerance = 0.0 }
ttft_ms_after_divergence = { direction = "up" }
"""

QUICK_TOML = """\
[quick.page_size]
page_sizes = [1, 16, 64]
request_tokens = [100, 300]
pair_tokens = 320
divergence_at = 200

[quick.predictions.page_size]
waste_tokens = { direction = "up" }
waste_tokens_vs_planner = { direction = "unchanged", tolerance = 0.0 }
bytes_per_token_slot = { direction = "unchanged", tolerance = 0.0 }
reused_tokens_at_divergence = { direction = "down", range = [192, 192] }
reused_tokens_vs_planner = { direction = "unchanged", tolerance = 0.0 }
"""


def check(ps: PageSizeSection, cfg: CommonConfig) -> None:
    fits(cfg, "page_size.pair_tokens", ps.pair_tokens + 1)
    fits(cfg, "page_size.request_tokens", max(ps.request_tokens) + 1)
    fits(cfg, "page_size.page_sizes", max(ps.page_sizes))  # a page the context cannot fill


def _guard_paging_bytes(f: FigureValues) -> tuple[str, str]:
    return "guarded", (
        f"demonstration {DEMO.number} reads the bytes of one token slot from the pool at every "
        f"page size ({fmt(f['slot_bytes'])} bytes each time): paging changes waste and reuse, "
        "not the size of a token"
    )


def _on_server(session: Session, run: ServerRun) -> DemoResult:
    """Through a server: its page measured instead (a client cannot set a server's page)."""
    from ctxlab.workshop.server_demos import page_size

    return page_size(session, run, DEMO, DEMO.config(session.cfg).request_tokens)


DEMO = Demonstration(
    number=3,
    key="page_size",
    title="Page size: rounding waste and reuse granularity",
    section=PageSizeSection,
    metrics=METRICS,
    layers=("storage", "serving"),
    steps=steps,
    run=run,
    toml=TOML,
    predictions_toml=PREDICTIONS_TOML,
    quick_toml=QUICK_TOML,
    guards=((Risk.PAGING_BYTES, _guard_paging_bytes),),
    check=check,
    required=("waste_tokens_vs_planner", "reused_tokens_at_divergence"),
    plots=(
        Plot(
            "3_page_size.png",
            "rounding waste and reuse at a divergence, measured against the planner",
        ),
    ),
    server=ServerMode(
        variant=_on_server,
        instead="measured its page instead of comparing page sizes",
        staircase=lambda section: section.pair_tokens,
    ),
)
