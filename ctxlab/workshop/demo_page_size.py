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
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from ctxlab.plan.paging import paged_request
from ctxlab.plan.sharing import prefix_sharing
from ctxlab.progress import Tracker
from ctxlab.stats import Direction
from ctxlab.workshop import latency_stats
from ctxlab.workshop.config import CommonConfig, Pos, Section, fits
from ctxlab.workshop.demonstration import Demonstration, FigureValues, Metric, Risk
from ctxlab.workshop.measure import median, send
from ctxlab.workshop.result import Column, DemoResult, Figures, Gain, Table, fmt
from ctxlab.workshop.session import Session


def steps(session: Session) -> int:
    c = DEMO.config(session.cfg)
    return (1 + c.repeats) * len(c.page_sizes)


def held_at_once(session: Session, page: int, lengths: list[int]) -> dict[str, float]:
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
    kv = engine.kv
    allocated = st.blocks_used * page // kv.n_lanes
    return {
        "held": sum(lengths),
        "allocated": allocated,
        "resident_bytes": st.resident_bytes,
        "slot_bytes": st.resident_bytes / allocated,
    }


def diverging_pair(session: Session, page: int, pair: int, at: int) -> dict[str, float]:
    """Send prompt A, then B = A's first `at` tokens + other text: what B reuses (new text
    every call, so no earlier pair is in the cache)."""
    llm = session.llm(page_size=page, pool_tokens=2 * pair + 4 * page + 64)
    a = session.text_ids(pair)
    b = a[:at] + session.text_ids(pair - at)
    if b[at] == a[at]:
        b[at] = session.other_token(a[at])
    first = send(llm, a, 1)
    second = send(llm, b, 1)
    return {
        "ttft_first_ms": first.ttft_ms,
        "ttft_ms": second.ttft_ms,
        "reused": second.reused,
        "recomputed": second.recomputed,
    }


def run(session: Session, tracker: Tracker) -> DemoResult:
    cfg = DEMO.config(session.cfg)
    res = DemoResult.of(DEMO, "run", "measured")
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
        pair = {
            "ttft_first": [p["ttft_first_ms"] for p in pairs],
            "ttft": [p["ttft_ms"] for p in pairs],
            "ttft_first_ms": median([p["ttft_first_ms"] for p in pairs]),
            "ttft_ms": median([p["ttft_ms"] for p in pairs]),
            # token counts: the same in every repeat (the pool's rule, not a timing)
            "reused": int(median([p["reused"] for p in pairs])),
            "recomputed": int(median([p["recomputed"] for p in pairs])),
        }
        planned = [paged_request(arch, n, page) for n in cfg.request_tokens]
        share = prefix_sharing(arch, cfg.pair_tokens, 2, cfg.divergence_at, page)
        rows.append(
            {
                "page": page,
                **held,
                **pair,
                "waste": held["allocated"] - held["held"],
                "waste_bytes": held["resident_bytes"] - held["held"] * per_token,
                "waste_plan": sum(p.wasted_tokens for p in planned),
                "waste_bytes_plan": sum(p.wasted_bytes for p in planned),
                "reused_plan": min(
                    share.bytes_avoided_full_pages // per_token,
                    (cfg.pair_tokens - 1) // page * page,
                ),
            }
        )
    _tables(session, res, rows, per_token)
    lo, hi = rows[0], rows[-1]
    res.observe("waste_tokens", lo["waste"], hi["waste"])
    res.observe(
        "waste_tokens_vs_planner", sum(r["waste_plan"] for r in rows), sum(r["waste"] for r in rows)
    )
    res.observe("bytes_per_token_slot", lo["slot_bytes"], hi["slot_bytes"])
    res.observe("reused_tokens_at_divergence", lo["reused"], hi["reused"])
    res.observe(
        "reused_tokens_vs_planner",
        sum(r["reused_plan"] for r in rows),
        sum(r["reused"] for r in rows),
    )
    moved = _compare(lo, hi, *_predicted(session))
    res.observe(
        "ttft_ms_after_divergence",
        lo["ttft_ms"],
        hi["ttft_ms"],
        1,
        change=moved.change,
        test=moved.test,
    )
    _explain(session, res, rows)
    from ctxlab.workshop.plots import plot_page_size

    res.plots.append(
        plot_page_size(
            [r["page"] for r in rows],
            [r["waste"] for r in rows],
            [r["waste_plan"] for r in rows],
            [r["reused"] for r in rows],
            [r["reused_plan"] for r in rows],
            session.out / "plots" / "3_page_size.png",
        )
    )
    return res


def _tables(session: Session, res: DemoResult, rows: list[dict], per_token: int) -> None:
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
            Column(f"change vs page {rows[0]['page']} ms", 1),
            Column("change 95 % low", 1),
            Column("change 95 % high", 1),
            Column("predicted"),
            Column("verdict"),
            Column("tokens computed for it"),
        ],
        note="95 % intervals: bootstrap of the median over the pairs, and of the difference "
        f"of medians against page {rows[0]['page']} (each side resampled on its own; "
        "ctxlab.stats); predicted: the run's prediction for ttft_ms_after_divergence (or up, "
        "no tolerance: larger pages recompute more); verdict: held when the whole interval "
        "of the change lies past the tolerance on the predicted side, failed when wholly on "
        "the other, otherwise within noise",
    )
    base = rows[0]
    direction, tol = _predicted(session)
    said = direction + (f" (tolerance {100 * tol:g}%)" if tol else "")
    for r in rows:
        waste.add(
            r["page"],
            len(cfg.request_tokens),
            r["held"],
            r["allocated"],
            r["waste"],
            r["waste_plan"],
            r["waste_bytes"] / 2**20,
            r["waste_bytes_plan"] / 2**20,
            round(r["slot_bytes"]),
        )
        reuse.add(
            r["page"],
            cfg.repeats,
            r["reused"],
            r["reused_plan"],
            cfg.divergence_at - r["reused"],
        )
        _, low, high = latency_stats.cells(r["ttft"], 50)
        if r is base:
            change: tuple = (None, None, None, None, "baseline")
        else:
            c = _compare(base, r, direction, tol)
            change = (c.change.value, c.change.low, c.change.high, said, c.verdict)
        serving.add(
            r["page"],
            len(r["ttft"]),
            r["ttft_first_ms"],
            r["ttft_ms"],
            low,
            high,
            *change,
            r["recomputed"],
        )
    res.tables += [waste, reuse, serving]


def _predicted(session: Session) -> tuple[Direction, float]:
    predictions = session.cfg.predictions.get("page_size", {})
    return latency_stats.predicted(predictions, "ttft_ms_after_divergence", "up")


def _compare(lo: dict, hi: dict, direction: Direction, tol: float) -> latency_stats.Compared:
    """The diverging prompt's median TTFT at `hi`'s page against `lo`'s (separate repeats)."""
    return latency_stats.compare(lo["ttft"], hi["ttft"], 50, direction, False, tol * lo["ttft_ms"])


def _change_words(f: Figures, lo: dict, hi: dict, direction: Direction, tol: float) -> str:
    """'12.3 ms [4.0, 20.1] (held)': the largest page's TTFT change against the smallest."""
    c = _compare(lo, hi, direction, tol)
    return (
        f"{f.say('ttft_change_ms', c.change.value, 1)} ms "
        f"[{f.say('ttft_change_low_ms', c.change.low, 1)}, "
        f"{f.say('ttft_change_high_ms', c.change.high, 1)}] ({c.verdict})"
    )


def _explain(session: Session, res: DemoResult, rows: list[dict]) -> None:
    f = res.figures
    cfg = DEMO.config(session.cfg)
    lo, hi = rows[0], rows[-1]
    pool = session.cfg.engine.kv_pool_tokens
    fit_lo = pool // (lo["allocated"] // len(cfg.request_tokens) or 1)
    fit_hi = pool // (hi["allocated"] // len(cfg.request_tokens) or 1)
    small, large = f.say("page_small", lo["page"]), f.say("page_large", hi["page"])
    res.summary = (
        "Page size changes how many slots a request holds and how much of a shared prefix "
        "can be reused; it does not change what one token slot costs."
    )
    res.gains.append(
        Gain(
            "smaller pages (less rounding waste)",
            f"at page {small} the requests held {f.say('allocated_small', lo['allocated'])} slots "
            f"for {f.say('held', lo['held'])} tokens; at page {large} they held "
            f"{f.say('allocated_large', hi['allocated'])}, wasting "
            f"{f.say('waste_large', hi['waste'])} slots "
            f"({f.say('waste_large_mib', hi['waste_bytes'] / 2**20, 3)} MiB); each slot costs "
            f"{f.say('slot_bytes', round(lo['slot_bytes']))} bytes at every page size",
            f"a pool of {f.say('pool_tokens', pool)} tokens holds "
            f"{f.say('fit_small', fit_lo)} requests of this mix's mean size at page {small} and "
            f"{f.say('fit_large', fit_hi)} at page {large}: waste is concurrency lost",
        )
    )
    res.gains.append(
        Gain(
            "smaller pages (finer reuse)",
            f"the second prompt shared {f.say('divergence_at', cfg.divergence_at)} tokens with the "
            f"first; page {small} reused {f.say('reused_small', lo['reused'])} of them, page "
            f"{large} {f.say('reused_large', hi['reused'])}: a page is reused whole or not at all",
            "the diverging prompt's first token took (median of "
            f"{f.say('pairs', len(lo['ttft']))} pairs) "
            f"{f.say('ttft_small_ms', lo['ttft_ms'], 1)} ms "
            f"at page {small} and {f.say('ttft_large_ms', hi['ttft_ms'], 1)} ms at page {large}, "
            f"a change of {_change_words(f, lo, hi, *_predicted(session))} (the smallest "
            "pages also pay for one hash and one block per few tokens)",
        )
    )
    res.notes.append(
        "Paging is an allocation choice: the bytes per token slot column is the same at every "
        "page size, so no saving here is a smaller token; it is fewer empty slots or more "
        "shared ones."
    )


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


def _guard_paging_bytes(f: FigureValues) -> tuple[str, str]:
    return "guarded", (
        f"demonstration {DEMO.number} reads the bytes of one token slot from the pool at every "
        f"page size ({fmt(f['slot_bytes'])} bytes each time): paging changes waste and reuse, "
        "not the size of a token"
    )


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
)
