"""The report of demonstration 10 (the question after compression): verdicts, tables, prose.

`demo_followup.py` measures frozen `Row`s (answers right per question, bytes, times); this
module judges them once (`verdicts`: the observations the predictions read, and the paired
changes the prose claims, as `Claims`) and renders tables, prose and the plot from the
records and those claims. Every comparison of accuracy is paired against the full cache
over the same questions (`ctxlab.stats.paired`: a bootstrap of the per-question
differences, the exact McNemar p beside it for 0/1 outcomes), and a class of policies is
read as the mean over its policies per question, so its pairing is kept too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from ctxlab import stats
from ctxlab.stats import Interval
from ctxlab.workshop.result import Column, DemoResult, Figures, Gain, Table

if TYPE_CHECKING:
    from ctxlab.workshop.followup_records import Measured, Row, RowKind
    from ctxlab.workshop.session import Session

PAIRED = "paired bootstrap over the same questions"
ClassKind = Literal["query-aware", "key-based", "positional"]
KINDS: tuple[ClassKind, ...] = ("query-aware", "key-based", "positional")
Moved = Literal["up", "down", "within noise"]


class Names(Protocol):
    """What a row's label reads of the demonstration's config table."""

    @property
    def policies(self) -> list[str]: ...
    @property
    def recall_base(self) -> str: ...


class Setting(Protocol):
    """A row, or the setting that fills one: enough to name it."""

    @property
    def kind(self) -> RowKind: ...
    @property
    def policy(self) -> int | None: ...
    @property
    def share(self) -> float | None: ...
    @property
    def tokens(self) -> int | None: ...


def label(r: Setting, names: Names) -> str:
    """A row's name in the tables: "full cache", "snapkv@0.25", "recall(snapkv)@128"."""
    if r.kind == "full":
        return "full cache"
    if r.kind == "fresh prefill":
        return "fresh prefill per question"
    if r.kind == "recall base":
        return f"{names.recall_base}@{r.tokens}"
    if r.kind == "recall":
        return f"recall({names.recall_base})@{r.tokens}"
    assert r.policy is not None and r.share is not None
    return f"{names.policies[r.policy]}@{r.share:g}"


@dataclass(frozen=True)
class Claim:
    """A paired change in points as the verdict reads it (widened to include zero where the
    exact sign test does not reject), and which way it moved beyond noise."""

    change: Interval
    moved: Moved


@dataclass(frozen=True)
class ClassClaim:
    """A class of policies at the first budget against the full cache."""

    kind: ClassKind
    rows: tuple[int, ...]  # indices in Measured.rows
    q1: Claim
    follow: Claim


@dataclass(frozen=True)
class Claims:
    """What `verdicts` judged, for the prose: each configured class, and recall against
    its base alone (None: no recall rows)."""

    classes: tuple[ClassClaim, ...]
    recall: Claim | None


# the exact sign test's level: a change is claimed only below it
SIGN_TEST_ALPHA = 0.05


def _pct(flags: Sequence[bool] | Sequence[float]) -> float:
    return 100 * math.fsum(float(x) for x in flags) / len(flags) if flags else math.nan


def _ci(flags: Sequence[bool]) -> tuple[float | None, float | None]:
    if not flags:
        return None, None
    ci = stats.proportion(flags)
    return 100 * ci.low, 100 * ci.high


def change_pts(
    a: Sequence[bool] | Sequence[float], b: Sequence[bool] | Sequence[float]
) -> stats.Paired:
    """b against a over the same questions, the change in percentage points."""
    p = stats.paired([float(x) for x in a], [float(x) for x in b])
    c = p.change
    return stats.Paired(
        Interval(100 * c.value, 100 * c.low, 100 * c.high, c.n, c.method),
        p.a_better,
        p.b_better,
        p.mcnemar_p,
    )


def claimed(p: stats.Paired) -> tuple[Interval, str]:
    """The paired change's interval as the verdict reads it, and how it was made. At a
    workshop's n a percentile bootstrap can be too narrow (three questions that all moved
    the same way give a zero-width interval), so a change is claimed only when the exact
    sign test on the questions that differ agrees (McNemar's test for 0/1 answers; for a
    class, whose per-question score is a share of its policies, the same binomial test on
    the sign of each difference): where its p is 0.05 or more, the interval is widened to
    include zero, which reads as within noise."""
    c = p.change
    sign_p = stats.mcnemar_exact(p.a_better, p.b_better)
    how = f"{PAIRED}, {c.n} questions, exact sign test p = {sign_p:.3f}"
    if sign_p < SIGN_TEST_ALPHA or c.low <= 0 <= c.high:
        return c, how
    widened = Interval(c.value, min(c.low, 0.0), max(c.high, 0.0), c.n, c.method)
    return widened, how + " (not significant: the interval is widened to include zero)"


def claim(p: stats.Paired) -> Claim:
    """The claimed change and which way it moved beyond noise."""
    ci, _ = claimed(p)
    return Claim(ci, "up" if ci.low > 0 else "down" if ci.high < 0 else "within noise")


def at_main(m: Measured, kind: str) -> list[Row]:
    """The rows of a class of policies at the first budget (the one the metrics read)."""
    return [r for r in m.rows if r.kind == kind and r.share == m.main]


def mean_per_question(rows: list[Row], attr: str) -> list[float]:
    """Per question, the share of `rows` that answered it right (keeps the pairing)."""
    lists = [getattr(r, attr) for r in rows]
    return [math.fsum(float(x) for x in col) / len(col) for col in zip(*lists, strict=True)]


def row_of(m: Measured, kind: str) -> Row | None:
    return next((r for r in m.rows if r.kind == kind), None)


def _mean(xs: Sequence[int] | Sequence[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else math.nan


def observe_accuracy(
    res: DemoResult,
    name: str,
    before: Sequence[bool] | Sequence[float],
    after: Sequence[bool] | Sequence[float],
    more: str = "",
) -> None:
    """Metric `name`: % right `before` -> `after` over the same questions, with the claimed
    paired change in points; `more` is added to the test's description."""
    ci, how = claimed(change_pts(before, after))
    res.observe(name, _pct(before), _pct(after), 1, change=ci, test=how + more)


def verdicts(res: DemoResult, m: Measured) -> Claims:
    """The observations the run's predictions are judged on, and the paired claims the
    prose states: the one place this demonstration judges."""
    _observe(res, m)
    full = row_of(m, "full")
    assert full is not None
    classes = []
    for kind in KINDS:
        rows = at_main(m, kind)
        if rows:
            q1 = claim(change_pts(full.q1, mean_per_question(rows, "q1")))
            fu = claim(change_pts(full.follow, mean_per_question(rows, "follow")))
            classes.append(ClassClaim(kind, tuple(m.rows.index(r) for r in rows), q1, fu))
    base, recall = row_of(m, "recall base"), row_of(m, "recall")
    rc = None if base is None or recall is None else claim(change_pts(base.follow, recall.follow))
    return Claims(tuple(classes), rc)


def _observe(res: DemoResult, m: Measured) -> None:
    full, fresh = row_of(m, "full"), row_of(m, "fresh prefill")
    assert full is not None and fresh is not None
    for kind, q1_name, fu_name in (
        ("query-aware", "q1_accuracy_query_aware_pct", "followup_accuracy_query_aware_pct"),
        ("positional", "q1_accuracy_positional_pct", "followup_accuracy_positional_pct"),
    ):
        rows = at_main(m, kind)
        if not rows:
            why = f"no {kind} policy was configured"
            res.observe(q1_name, None, None, 1, why_missing=why)
            res.observe(fu_name, None, None, 1, why_missing=why)
            continue
        many = f"{len(rows)} polic{'y' if len(rows) == 1 else 'ies'}"
        for name, attr in ((q1_name, "q1"), (fu_name, "follow")):
            seen = mean_per_question(rows, attr)
            observe_accuracy(res, name, getattr(full, attr), seen, f"; {many}")
    base, recall = row_of(m, "recall base"), row_of(m, "recall")
    if base is None or recall is None:
        why = "recall_tokens is 0: no recall rows"
        res.observe("followup_accuracy_recall_pct", None, None, 1, why_missing=why)
        res.observe("recall_tpot_ms", None, None, 1, why_missing=why)
    else:
        observe_accuracy(res, "followup_accuracy_recall_pct", base.follow, recall.follow)
        res.observe_latency(
            "recall_tpot_ms", base.tpot_ms, recall.tpot_ms, 2, items="follow-ups", paired=True
        )
    observe_accuracy(res, "followup_accuracy_fresh_pct", full.follow, fresh.follow)
    small = [r for r in m.rows if r.share == m.main]
    res.observe(
        "kv_bytes_resident",
        round(_mean(full.resident_q1)),
        round(_mean([b for r in small for b in r.resident_q1])) if small else None,
        0,
        why_missing=None if small else "no policy was configured",
    )
    res.observe_latency("followup_ttft_ms", list(m.fresh_ttft_ms), list(full.ttft_ms), 1)


def _kib(x: float) -> float:
    return x / 1024


def tables(session: Session, res: DemoResult, m: Measured, names: Names) -> None:
    full = row_of(m, "full")
    assert full is not None
    f = res.figures
    n_docs, n_fu = len(full.q1), len(full.follow)
    shortest = f.say("prompt_tokens_min", min(m.prompt_tokens))
    longest = f.say("prompt_tokens_max", max(m.prompt_tokens))
    task = Table(
        "followup_task",
        "task",
        f"Demonstration 10: question 1 and {n_fu} follow-ups ({n_docs} conversations) against "
        "the cache compressed for question 1",
        "measured",
        [
            Column("setting"),
            Column("class"),
            Column("budget (share of the prompt)", 2),
            Column("budget (tokens)"),
            Column("question 1 right"),
            Column("question 1 %", 1),
            Column("95 % low", 1),
            Column("95 % high", 1),
            Column("follow-ups right"),
            Column("follow-ups %", 1),
            Column("95 % low", 1),
            Column("95 % high", 1),
            Column("follow-ups vs full cache, points", 1),
            Column("paired 95 % low", 1),
            Column("paired 95 % high", 1),
            Column("McNemar p", 3),
        ],
        note=f"{f.say('documents', n_docs)} seeded documents of {shortest} to {longest} "
        f"prompt tokens, {f.say('facts', n_fu // n_docs + 1)} planted facts each (4-digit "
        "numbers); "
        "question 1 is a chat turn with its key in the prompt's last tokens (the observation "
        "window); the cache is compressed once at the end of that prompt, and each follow-up "
        "is a new turn appended to the same cache. Right: the fact's number in the greedy "
        "answer. Intervals: Wilson's for a row, paired bootstrap against the full cache over "
        "the same questions (the exact McNemar p beside it). Class: what the policy observes "
        "(query-aware: attention of the prompt's last queries or of decode steps; key-based: "
        "keys only; positional: nothing).",
    )
    for r in m.rows:
        d = change_pts(full.follow, r.follow)
        task.add(
            label(r, names),
            r.kind,
            r.share,
            r.tokens,
            sum(r.q1),
            _pct(r.q1),
            *_ci(r.q1),
            sum(r.follow),
            _pct(r.follow),
            *_ci(r.follow),
            None if r is full else d.change.value,
            None if r is full else d.change.low,
            None if r is full else d.change.high,
            None if r is full else d.mcnemar_p,
        )
    storage = Table(
        "followup_storage",
        "storage",
        "Demonstration 10: KV bytes one conversation holds between its questions",
        "measured",
        [
            Column("setting"),
            Column("KiB after question 1", 1),
            Column("% of the full cache", 1),
            Column("KiB after the last follow-up", 1),
            Column("far tier: KiB sent out", 1),
            Column("far tier: KiB brought back", 1),
        ],
        note="mean per conversation, read from the pool's blocks (`resident_bytes`: whole "
        f"blocks of {f.say('page_tokens', session.cfg.engine.page_size)} token slots per "
        f"layer and KV head, {f.say('slot_bytes', m.slot_bytes)} bytes per token slot); a "
        "held cache grows by each turn's tokens unless its policy cuts during decode; the "
        "fresh-prefill row holds its cache only while it answers. Recall's far tier is host "
        "memory, outside the pool.",
    )
    full_q1 = _mean(full.resident_q1)
    for r in m.rows:
        storage.add(
            label(r, names),
            _kib(_mean(r.resident_q1)),
            100 * _mean(r.resident_q1) / full_q1,
            _kib(_mean(r.resident_end)),
            None if r.far_bytes is None else _kib(r.far_bytes / n_docs),
            None if r.far_back_bytes is None else _kib(r.far_back_bytes / n_docs),
        )
    serving = Table(
        "followup_serving",
        "serving",
        "Demonstration 10: what a follow-up costs to start and to decode",
        "measured",
        [
            Column("setting"),
            Column("follow-ups"),
            Column("prompt tokens computed per follow-up", 1),
            Column("TTFT p50 ms", 1),
            Column("TTFT p95 ms", 1),
            Column("TPOT p50 ms", 2),
            Column("preemptions"),
        ],
        note=f"follow-ups of the {n_docs} conversations are asked together (one engine step "
        "prefills all of them), so a TTFT is that step's; the fresh-prefill row's TTFT is a "
        "cold prefill of one document and its question, one request at a time "
        f"({f.say('fresh_requests', len(m.fresh_ttft_ms))} requests: its follow-ups were "
        "answered from the prefix cache and their times are not a fresh prefill's). A "
        "preemption would recompute a conversation from its text (the cache rebuilt whole), "
        "so it is counted.",
    )
    for r in m.rows:
        fresh = r.kind == "fresh prefill"
        times = m.fresh_ttft_ms if fresh else r.ttft_ms
        serving.add(
            label(r, names),
            len(r.follow),
            _mean(m.prompt_tokens) if fresh else _mean(r.computed),
            stats.median(times),
            stats.percentile(times, 95),
            None if fresh else stats.median(r.tpot_ms),
            r.preemptions,
        )
    res.tables += [task, storage, serving]


def explain(
    session: Session,
    res: DemoResult,
    m: Measured,
    claims: Claims,
    names: Names,
    full_documents: int,
) -> None:
    """Summary, gains and notes from the records and what `verdicts` claimed (the note on n
    says what `--full`, with `full_documents` conversations, adds); every number from
    `res.figures.say`."""
    f = res.figures
    full, fresh = row_of(m, "full"), row_of(m, "fresh prefill")
    assert full is not None and fresh is not None
    n_docs, n_fu = len(full.q1), len(full.follow)
    f.say("conversations", n_docs)
    f.say("followups", n_fu)
    f.say("wall_s", m.wall_s, 1)
    res.summary = (
        f"{f.say('settings', len(m.rows))} settings, each over the same "
        f"{n_docs} conversations: question 1 compresses the cache, then {n_fu} follow-ups "
        f"in all are asked against it; full cache: {f.say('full_q1_pct', _pct(full.q1), 1)}% "
        f"of question 1 and {f.say('full_followup_pct', _pct(full.follow), 1)}% of the "
        "follow-ups right."
    )
    said = []
    for cc in claims.classes:
        key = cc.kind.replace("-", "_")
        said.append(
            f"{cc.kind} ({', '.join(label(m.rows[i], names) for i in cc.rows)}): question 1 "
            f"{_moved(f, f'{key}_q1', cc.q1)}, follow-ups "
            f"{_moved(f, f'{key}_followup', cc.follow)}"
        )
    small = [r for r in m.rows if r.share == m.main]
    whole = _mean(full.resident_q1)
    if small:
        kept = _mean([b for r in small for b in r.resident_q1])
        res.gains.append(
            Gain(
                f"a compressed cache at {m.main:g} of the prompt against the full cache",
                f"a conversation holds {f.say('small_kib', _kib(kept), 1)} KiB of KV between "
                f"its questions instead of {f.say('full_kib', _kib(whole), 1)} KiB "
                f"({f.say('small_share_pct', 100 * kept / whole, 1)}%): the same pool holds "
                f"about {f.say('conversations_factor', whole / kept, 1)} times as many idle "
                "conversations",
                "against the full cache over the same questions (paired 95 % intervals, "
                "points): " + "; ".join(said) + ". " + _n_sentence(f, n_docs, n_fu),
            )
        )
    ttft = stats.median_difference(m.fresh_ttft_ms, full.ttft_ms)
    res.gains.append(
        Gain(
            "holding the full cache against a fresh prefill per question",
            f"the held cache computes {f.say('full_computed', _mean(full.computed), 1)} prompt "
            f"tokens per follow-up instead of {f.say('fresh_computed', _mean(m.prompt_tokens), 1)}"
            f", and keeps {f.say('full_kib_held', _kib(_mean(full.resident_end)), 1)} KiB per "
            "conversation resident between questions, where a fresh prefill holds nothing",
            f"the follow-up's first token after "
            f"{f.say('full_ttft_ms', stats.median(full.ttft_ms), 1)} ms (median) instead of "
            f"{f.say('fresh_ttft_ms', stats.median(m.fresh_ttft_ms), 1)} ms"
            f" (95 % interval of the difference [{f.say('ttft_low_ms', ttft.low, 1)}, "
            f"{f.say('ttft_high_ms', ttft.high, 1)}] ms), with follow-ups "
            f"{f.say('full_fu_pct', _pct(full.follow), 1)}% right against "
            f"{f.say('fresh_fu_pct', _pct(fresh.follow), 1)}% for the fresh prefill",
        )
    )
    base, recall = row_of(m, "recall base"), row_of(m, "recall")
    if base is not None and recall is not None and claims.recall is not None:
        d = claims.recall
        res.gains.append(
            Gain(
                f"{label(recall, names)} against {label(base, names)}",
                f"recall sent {f.say('far_out_kib', _kib((recall.far_bytes or 0) / n_docs), 1)}"
                f" KiB per conversation to the far tier (host memory) and brought "
                f"{f.say('far_in_kib', _kib((recall.far_back_bytes or 0) / n_docs), 1)} KiB back "
                "while answering; the pool held "
                f"{f.say('recall_kib', _kib(_mean(recall.resident_q1)), 1)} KiB against "
                f"{f.say('recall_base_kib', _kib(_mean(base.resident_q1)), 1)}",
                f"follow-ups {f.say('recall_base_pct', _pct(base.follow), 1)}% -> "
                f"{f.say('recall_pct', _pct(recall.follow), 1)}% right "
                f"({_moved(f, 'recall_followup', d)}), at "
                f"{f.say('recall_tpot', stats.median(recall.tpot_ms), 2)} ms per output token "
                f"against {f.say('recall_base_tpot', stats.median(base.tpot_ms), 2)}",
            )
        )
    if any(r.preemptions for r in m.rows):
        res.notes.append(
            f"{f.say('preemptions', sum(r.preemptions for r in m.rows))} preemption(s): a "
            "preempted conversation was recomputed from its text, so its cache was rebuilt "
            "from the whole conversation; raise followup.pool_tokens."
        )
    res.notes.append(
        f"n is small: {n_docs} question-1 answers and {n_fu} follow-ups per setting, so one "
        f"question moves question 1 by {f.say('step_q1_pts', 100 / n_docs, 1)} points and "
        f"the follow-ups by {f.say('step_fu_pts', 100 / n_fu, 1)}. A change is claimed only "
        "where its paired 95 % interval excludes zero and the exact sign test on the "
        "questions that differ (McNemar's, for one policy) gives p < "
        f"{f.say('sign_test_alpha', SIGN_TEST_ALPHA, 2)}; otherwise it is within noise, not "
        "established at this n."
        + (
            f" `--full` asks followup.documents = {f.say('full_documents', full_documents)}: "
            f"{f.say('full_q1_pairs', full_documents)} question-1 pairs and "
            f"{f.say('full_followup_pairs', full_documents * (n_fu // n_docs))} follow-up "
            "pairs per setting, for about "
            f"{f.say('full_cold_tokens', (full_documents - n_docs) * _mean(m.prompt_tokens), 0)}"
            " more tokens of cold prefill (the documents); each round of questions is batched "
            "over the documents, so the rounds cost little more."
            if full_documents > n_docs
            else ""
        )
    )
    res.notes.append(
        "Question 1 is the best case for a query-aware policy: its key is in the observation "
        "window when the cache is compressed. The follow-ups ask about facts that question "
        "did not look at; what the policy evicted then is gone (only recall can bring any of "
        "it back), which is the seed's warning about compressed caches in conversations."
    )


def _moved(f: Figures, name: str, c: Claim) -> str:
    """A claimed change in points with its interval, and whether it is beyond noise."""
    ci = c.change
    text = (
        f"{f.say(name + '_pts', ci.value, 1)} points [{f.say(name + '_low_pts', ci.low, 1)}, "
        f"{f.say(name + '_high_pts', ci.high, 1)}]"
    )
    if c.moved != "within noise":
        return text
    return text + " (within noise, not established at this n)"


def _n_sentence(f: Figures, n_docs: int, n_fu: int) -> str:
    return (
        f"Each interval is over {n_docs} question-1 answers or {n_fu} follow-ups; a class "
        "is the mean of its policies per question."
    )


def draw(m: Measured, names: Names, path: Path) -> Path:
    """Per setting: question 1 and follow-ups right, with 95 % intervals (left); KiB held
    between questions (right)."""
    from ctxlab.workshop.plots import figure, save

    fig, (left, right) = figure()
    labels = [label(r, names) for r in m.rows]
    x = list(range(len(labels)))
    for off, attr, which, marker in (
        (-0.15, "q1", "question 1", "o"),
        (0.15, "follow", "follow-ups", "s"),
    ):
        vals, lows, highs = [], [], []
        for r in m.rows:
            flags = getattr(r, attr)
            lo, hi = _ci(flags)
            v = _pct(flags)
            vals.append(v)
            lows.append(v - (lo or 0))
            highs.append((hi or 0) - v)
        left.errorbar(
            [i + off for i in x], vals, yerr=[lows, highs], fmt=marker, capsize=2, label=which
        )
    left.set_xticks(x, labels, rotation=75, fontsize=6)
    left.set_ylim(-5, 105)
    left.set_ylabel("% answered right (95 % interval)")
    left.set_title("the question after compression")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    right.bar(x, [_kib(_mean(r.resident_q1)) for r in m.rows], color="tab:grey")
    right.set_xticks(x, labels, rotation=75, fontsize=6)
    right.set_ylabel("KiB held per conversation after question 1")
    right.set_title("what each setting keeps")
    right.grid(alpha=0.3, axis="y")
    return save(fig, path)
