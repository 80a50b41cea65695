"""Demonstration 5: compact a history and list the facts that cannot be reconstructed.

A seeded multi-session conversation with planted facts (a locker code, a cat's name, one fact
corrected later) is replayed message by message through the application-memory layer
(`ctxlab.memory`) under a context window, once per strategy: truncation (drop the oldest
turns), a recursive summary written by the model, tiered memory (evicted turns live on in
recall memory and the user's turn brings the relevant ones back), and compaction as chat
products do it (the model's summary replaces the history and the evicted turns are deleted
from the log, so a fact the summary left out is really gone). The memory layer's loss
report classifies every fact: still in the compacted context, recoverable (a search of the
message log returns the message that states it), or lost; the lost facts are listed. Then
each fact's question is asked with the prompt the strategy builds for it, so a strategy is
judged by the answers it still supports and by whether it brought the fact back itself,
not by the tokens it saved.

The file is in three parts: `measure` returns frozen records (`Records`: an `Outcome` per
strategy with a `FactResult` per planted fact), `verdicts` records the observations and
makes the paired comparison the prose cites (the one place it judges), and the tables,
prose and plot are rendered from the records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, field_validator, model_validator

from ctxlab import stats
from ctxlab.progress import Tracker
from ctxlab.stats import Interval
from ctxlab.workshop.config import CommonConfig, Pos, Section, Seed, fits
from ctxlab.workshop.demonstration import (
    Demonstration,
    FigureValues,
    Metric,
    Plot,
    Risk,
    ServerMode,
)
from ctxlab.workshop.measure import Timer
from ctxlab.workshop.result import Column, DemoResult, Gain, Table, fmt
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from ctxlab.memory.fixtures import Fact
    from ctxlab.memory.strategies import Strategy
    from ctxlab.workshop.result import Figures


LABELS = {
    "truncation": "truncation",
    "summary": "recursive summary (by the model)",
    "summary-extractive": "extractive summary (sentences kept verbatim)",
    "tiered": "tiered memory (recall archive)",
    "compact": "compaction (summary replaces the history, log deleted)",
}


StrategyName = Literal["truncation", "summary", "summary-extractive", "tiered", "compact"]
FactStatus = Literal["in_context", "recoverable", "lost"]
STATUSES: tuple[FactStatus, ...] = ("in_context", "recoverable", "lost")


@dataclass(frozen=True)
class FactResult:
    """One planted fact under one strategy: the loss report's class and what the question
    got."""

    status: FactStatus
    search_rank: int | None  # where the log search put its message (None: not in the top k)
    correct: bool  # the model answered its question right
    in_prompt: bool  # its answer was in the prompt its question was asked with


@dataclass(frozen=True)
class Outcome:
    """One strategy's loss report plus what this demonstration measured around it."""

    strategy: StrategyName
    facts: tuple[FactResult, ...]  # in the fixture's order
    tokens_before: int  # the whole history as one prompt
    tokens_after: int  # the compacted prompt
    compactions: int
    keeps_log: bool  # False: the strategy deleted what it evicted from the log
    question_prompt_tokens: float  # mean prompt tokens of the questions' prompts
    answer_tokens: float  # mean output tokens of the answers
    summary_calls: int  # model calls made while compacting (the summarizer's)
    summary_prompt_tokens: int
    summary_output_tokens: int
    cpu_s: float
    wall_s: float

    def count(self, status: FactStatus) -> int:
        return sum(f.status == status for f in self.facts)

    @property
    def in_prompt(self) -> int:
        return sum(f.in_prompt for f in self.facts)

    @property
    def correct(self) -> int:
        return sum(f.correct for f in self.facts)

    @property
    def accuracy(self) -> float:
        return self.correct / len(self.facts) if self.facts else 0.0

    @property
    def kept(self) -> int:
        return self.count("in_context") + self.count("recoverable")

    @property
    def kept_interval(self) -> Interval:
        """Facts kept (in context or recoverable), Wilson 95 % over the facts."""
        return stats.wilson(self.kept, len(self.facts))

    @property
    def accuracy_interval(self) -> Interval:
        """Answers right, Wilson 95 % over the facts."""
        return stats.proportion([f.correct for f in self.facts])


@dataclass(frozen=True)
class PlantedFact:
    """One planted fact of the seeded conversation."""

    id: str  # the fixture's name for it (text of the fixture, not of the report)
    message: int  # the index of the message that states it


@dataclass(frozen=True)
class Records:
    """What demonstration 5 measured; every table, verdict and sentence reads these."""

    messages: int  # of the conversation
    facts: tuple[PlantedFact, ...]
    outcomes: tuple[Outcome, ...]  # in the configured order of strategies
    ceiling_pct: float | None  # answers right with only each fact's own message

    def outcome(self, name: StrategyName) -> Outcome | None:
        return next((o for o in self.outcomes if o.strategy == name), None)

    def lost(self, o: Outcome) -> list[str]:
        """Ids of the facts that cannot be reconstructed under `o`."""
        return [p.id for p, f in zip(self.facts, o.facts, strict=True) if f.status == "lost"]


@dataclass(frozen=True)
class Discard:
    """Compaction that deletes the log against tiered memory, paired over the same facts."""

    kept_change: Interval  # facts kept, compact - tiered, as a share of the facts
    answers_change: Interval  # answers right, likewise
    verdict: str  # of "compaction keeps fewer facts" on the kept change


def steps(session: Session) -> int:
    c = DEMO.config(session.cfg)
    return len(c.strategies) + (1 if c.ceiling else 0)


def strategy(name: str, summary_tokens: int) -> Strategy:
    """A fresh strategy object; the summaries get the configured length."""
    from ctxlab.memory.strategies import make_strategy
    from ctxlab.memory.strategies.summary import ExtractiveSummary, RecursiveSummary
    from ctxlab.memory.summarizers import ExtractiveSummarizer, ModelSummarizer

    if name == "summary":
        return RecursiveSummary(ModelSummarizer(), summary_tokens)
    if name == "summary-extractive":
        return ExtractiveSummary(ExtractiveSummarizer(), summary_tokens)
    if name == "compact":
        from ctxlab.memory.strategies.compact import CompactSummary

        return CompactSummary(ModelSummarizer(), summary_tokens)
    return make_strategy(name)


def in_prompt(chats: list[list[dict[str, str]]], facts: list[Fact]) -> list[bool]:
    """Per fact, whether its answer is in the prompt its question was asked with (the
    question itself, the last message, excluded)."""
    from ctxlab.memory.context import context_text
    from ctxlab.memory.scoring import normalize

    if len(chats) != len(facts) or any(
        c[-1]["content"] != f.question for c, f in zip(chats, facts, strict=True)
    ):
        raise RuntimeError("the memory layer's last model call was not the facts' questions")
    return [
        f" {normalize(f.answer)} " in f" {normalize(context_text(c[:-1]))} "
        for c, f in zip(chats, facts, strict=True)
    ]


def measure(session: Session, tracker: Tracker) -> Records:
    """The conversation replayed under every strategy, each fact's question asked, and the
    model's ceiling (nothing formatted)."""
    from ctxlab.memory import MemoryConfig, compaction_report, conversation_fixture, model_ceiling
    from ctxlab.memory.embed import WordLlamaEmbedder

    c = DEMO.config(session.cfg)
    fx = conversation_fixture(c.fixture_seed, c.sessions, c.turns_per_session, c.facts)
    n = len(fx.facts)
    # the largest batch: every fact's question at once, each prompt within the window
    backend = session.requests.chat((n + 2) * c.window_tokens, n + 1)
    mem = MemoryConfig(
        window=c.window_tokens,
        reserve=c.reserve_tokens,
        note_position=c.note_position,
        retrieve_k=c.search_k,
    )
    embedder = WordLlamaEmbedder()
    outcomes: list[Outcome] = []
    for name in c.strategies:
        backend.log.clear()
        with Timer() as t:
            report = compaction_report(
                fx.history,
                fx.facts,
                strategy(name, c.summary_tokens),
                backend,
                mem,
                search_k=c.search_k,
                retriever=c.retriever,
                answer_tokens=c.answer_tokens,
                embedder=embedder,
            )
        calls = backend.log.calls
        asked, before = calls[-1], calls[:-1]
        shown = in_prompt(asked.chats, fx.facts)
        outcomes.append(
            Outcome(
                name,
                tuple(
                    FactResult(_status(f.status), f.search_rank, f.correct, shown[i])
                    for i, f in enumerate(report.facts)
                ),
                report.tokens_before,
                report.tokens_after,
                report.compactions,
                report.keeps_log,
                asked.prompt_tokens / n,
                asked.output_tokens / n,
                len(before),
                sum(x.prompt_tokens for x in before),
                sum(x.output_tokens for x in before),
                t.cpu_s,
                t.wall_s,
            )
        )
        tracker.advance()
    ceiling = None
    if c.ceiling:
        ceiling = 100 * model_ceiling(fx.history, fx.facts, backend, mem, c.answer_tokens)
        tracker.advance()
    facts = tuple(PlantedFact(f.id, f.message) for f in fx.facts)
    return Records(len(fx.history), facts, tuple(outcomes), ceiling)


def _status(status: str) -> FactStatus:
    """The loss report's class of a fact, checked against the three it can be."""
    for known in STATUSES:
        if status == known:
            return known
    raise RuntimeError(f"the loss report classed a fact {status!r}")


def run(session: Session, tracker: Tracker) -> DemoResult:
    """Measure, judge, then render tables, prose and the plot from the records."""
    records = measure(session, tracker)
    res = DemoResult.of(DEMO, "run", "measured")
    discard = verdicts(records, res)
    _tables(session, res, records)
    _explain(session, res, records, discard)
    res.plots.append(
        draw(
            {LABELS[o.strategy]: _counts(o) for o in records.outcomes},
            records.ceiling_pct,
            DEMO.plot("5_compaction.png").path(session.out),
        )
    )
    return res


def _counts(o: Outcome) -> dict[str, float]:
    return {
        "in context": o.count("in_context"),
        "recoverable": o.count("recoverable"),
        "lost": o.count("lost"),
        "in prompt": o.in_prompt,
        "accuracy_pct": 100 * o.accuracy,
        "accuracy_low_pct": 100 * o.accuracy_interval.low,
        "accuracy_high_pct": 100 * o.accuracy_interval.high,
    }


def verdicts(r: Records, res: DemoResult) -> Discard | None:
    """The metrics the run's predictions are judged on (`res.observe`, truncation against
    tiered memory), and compaction against tiered memory paired over the same facts (for
    the prose): the one place this demonstration judges."""
    base, seen = r.outcome("truncation"), r.outcome("tiered")
    metrics = {
        "facts_in_context": (lambda o: o.count("in_context"), 0),
        "facts_recoverable": (lambda o: o.count("recoverable"), 0),
        "facts_lost": (lambda o: o.count("lost"), 0),
        "facts_in_prompt": (lambda o: o.in_prompt, 0),
        "answer_accuracy_pct": (lambda o: 100 * o.accuracy, 1),
        "context_tokens": (lambda o: o.tokens_after, 0),
    }
    for metric, (value, digits) in metrics.items():
        if base is None or seen is None:
            missing = [s for s, o in (("truncation", base), ("tiered", seen)) if o is None]
            res.observe(
                metric,
                None,
                None,
                digits,
                why_missing=f"compaction.strategies leaves out {' and '.join(missing)}",
            )
        else:
            res.observe(metric, value(base), value(seen), digits)
    compact = r.outcome("compact")
    if compact is None or seen is None:
        return None
    kept = stats.paired(
        [float(x.status != "lost") for x in seen.facts],
        [float(x.status != "lost") for x in compact.facts],
    )
    answers = stats.paired(
        [float(x.correct) for x in seen.facts], [float(x.correct) for x in compact.facts]
    )
    return Discard(kept.change, answers.change, stats.verdict(kept.change, "down"))


def _tables(session: Session, res: DemoResult, r: Records) -> None:
    c, cost = DEMO.config(session.cfg), session.cfg.cost
    n, ceiling = len(r.facts), r.ceiling_pct
    task = Table(
        "compaction_task",
        "task",
        f"Demonstration 5: {n} planted facts after compacting {r.messages} messages into "
        f"a {c.window_tokens}-token window",
        "measured",
        [
            Column("strategy"),
            Column("in context"),
            Column("recoverable by search"),
            Column("lost"),
            Column("kept %", 1),
            Column("kept 95 % low", 1),
            Column("kept 95 % high", 1),
            Column("in the prompt when asked"),
            Column("answered right"),
            Column("accuracy %", 1),
            Column("accuracy 95 % low", 1),
            Column("accuracy 95 % high", 1),
            Column("tokens before"),
            Column("tokens after"),
            Column("compactions"),
        ],
        note=f"recoverable: out of the context, but a {c.retriever} search of the message log "
        f"for the fact's question returns its message in the top {c.search_k}; the log keeps "
        "every message under every strategy but compaction, which deletes what it evicts, and "
        "only tiered memory searches it by itself. Kept: in context or recoverable. In the "
        "prompt when asked: the fact's answer is in the prompt the strategy builds for its "
        "question. Greedy answers, string match. Intervals: Wilson 95 % over the facts.",
    )
    for o in r.outcomes:
        kept, right = o.kept_interval, o.accuracy_interval
        task.add(
            LABELS[o.strategy],
            o.count("in_context"),
            o.count("recoverable"),
            o.count("lost"),
            100 * o.kept / n,
            100 * kept.low,
            100 * kept.high,
            o.in_prompt,
            o.correct,
            100 * o.accuracy,
            100 * right.low,
            100 * right.high,
            o.tokens_before,
            o.tokens_after,
            o.compactions,
        )
    if ceiling is not None:
        ceiling_ci = stats.wilson(round(ceiling * n / 100), n)
        task.add(
            "each fact's own message only (the model's ceiling)",
            None,
            None,
            None,
            None,
            None,
            None,
            n,
            round(ceiling * n / 100),
            ceiling,
            100 * ceiling_ci.low,
            100 * ceiling_ci.high,
            None,
            None,
            None,
        )
    per_fact = Table(
        "compaction_facts",
        "task",
        "Demonstration 5: every planted fact under every strategy",
        "measured",
        [Column("fact"), Column("stated in message"), Column("search rank")]
        + [Column(o.strategy) for o in r.outcomes],
        note="per strategy: in context, recoverable or lost; then whether the strategy put "
        "the answer in the prompt for the question (in prompt), and whether the model answered "
        "right; search rank: where the log search put the fact's message (n/a: not in the top "
        f"{c.search_k})",
    )
    first = r.outcomes[0]
    for i, fact in enumerate(r.facts):
        cells = []
        for o in r.outcomes:
            f = o.facts[i]
            cell = f.status.replace("_", " ")
            cell += ", in prompt" if f.in_prompt else ", not in prompt"
            cell += ", answered" if f.correct else ", wrong"
            cells.append(cell)
        per_fact.add(fact.id, fact.message + 1, first.facts[i].search_rank, *cells)
    money = cost.currency
    costs = Table(
        "compaction_cost",
        "cost",
        "Demonstration 5: what each strategy costs",
        "measured",
        [
            Column("strategy"),
            Column("prompt tokens per question", 1),
            Column("summarizer model calls"),
            Column("summarizer tokens in"),
            Column("summarizer tokens out"),
            Column(f"hosted {money} per 1,000 questions", 4),
            Column(f"hosted {money} to compact the conversation", 4),
            Column("CPU s (replay and answers)", 1),
        ],
        note="hosted: the configured per-million-token input and output prices over the exact "
        "token counts (chat template included); the summarizer's calls are paid once per "
        "compaction, the questions' prompts at every question",
    )
    for o in r.outcomes:
        costs.add(
            LABELS[o.strategy],
            o.question_prompt_tokens,
            o.summary_calls,
            o.summary_prompt_tokens,
            o.summary_output_tokens,
            _hosted(session, o.question_prompt_tokens, o.answer_tokens) * 1000,
            _hosted(session, o.summary_prompt_tokens, o.summary_output_tokens),
            o.cpu_s,
        )
    res.tables += [task, per_fact, costs]


def _hosted(session: Session, prompt_tokens: float, output_tokens: float) -> float:
    card = session.cfg.cost.card()
    return card.cost(round(prompt_tokens), round(output_tokens)).total


def _explain(session: Session, res: DemoResult, r: Records, discard: Discard | None) -> None:
    f, c = res.figures, DEMO.config(session.cfg)
    n, ceiling = len(r.facts), r.ceiling_pct
    first = r.outcomes[0]
    res.summary = (
        f"A seeded conversation of {f.say('messages', r.messages)} messages "
        f"({f.say('history_tokens', first.tokens_before)} tokens as one prompt) with "
        f"{f.say('facts', n)} planted facts, replayed under a "
        f"{f.say('window_tokens', c.window_tokens)}-token window "
        f"({f.say('budget_tokens', c.window_tokens - c.reserve_tokens)} for the prompt)."
    )
    for o in r.outcomes:
        f.say(f"accuracy_{o.strategy}", 100 * o.accuracy, 1)
        f.say(f"in_prompt_{o.strategy}", o.in_prompt)
        f.say(f"tokens_after_{o.strategy}", o.tokens_after)
        f.say(f"lost_{o.strategy}", o.count("lost"))
    if ceiling is not None:
        f.say("ceiling_pct", ceiling, 1)
    ceiling_text = (
        f" (with only each fact's own message: {f.say('ceiling_pct', ceiling, 1)}%, the "
        "model's ceiling)"
        if ceiling is not None
        else ""
    )
    trunc, tiered, summary = r.outcome("truncation"), r.outcome("tiered"), r.outcome("summary")
    if trunc is not None and tiered is not None:
        res.gains.append(
            Gain(
                "tiered memory against truncation",
                f"both cut the {f.say('history_tokens', first.tokens_before)}-token history to "
                f"{f.say('tokens_after_truncation', trunc.tokens_after)} and "
                f"{f.say('tokens_after_tiered', tiered.tokens_after)} tokens and kept "
                "every message in the log; the prompt for a fact's question held its answer "
                f"for {f.say('in_prompt_truncation', trunc.in_prompt)} of "
                f"{f.say('facts', n)} facts under truncation and "
                f"{f.say('in_prompt_tiered', tiered.in_prompt)} under tiered memory, "
                "which recalled the stating message next to the question; lost to both: "
                f"{f.say('lost_truncation', trunc.count('lost'))} and "
                f"{f.say('lost_tiered', tiered.count('lost'))}",
                f"answers right: {f.say('accuracy_truncation', 100 * trunc.accuracy, 1)}"
                f"% with truncation, {f.say('accuracy_tiered', 100 * tiered.accuracy, 1)}"
                f"% with tiered memory{ceiling_text}; a question under tiered memory costs "
                f"{f.say('question_tokens_tiered', tiered.question_prompt_tokens, 1)} prompt "
                "tokens against "
                f"{f.say('question_tokens_truncation', trunc.question_prompt_tokens, 1)}",
            )
        )
    if summary is not None and trunc is not None:
        res.gains.append(
            Gain(
                "a recursive summary written by the model, against truncation",
                f"{f.say('summary_calls', summary.summary_calls)} model calls read "
                f"{f.say('summary_tokens_in', summary.summary_prompt_tokens)} tokens and wrote "
                f"{f.say('summary_tokens_out', summary.summary_output_tokens)} tokens of "
                f"summary; its prompt held the answer for "
                f"{f.say('in_prompt_summary', summary.in_prompt)} of "
                f"{f.say('facts', n)} facts against truncation's "
                f"{f.say('in_prompt_truncation', trunc.in_prompt)}, in "
                f"{f.say('tokens_after_summary', summary.tokens_after)} tokens against "
                f"{f.say('tokens_after_truncation', trunc.tokens_after)}",
                "answers right: "
                f"{f.say('accuracy_summary', 100 * summary.accuracy, 1)}% against "
                f"{f.say('accuracy_truncation', 100 * trunc.accuracy, 1)}%; the "
                f"summarizing took {f.say('summary_cpu_s', summary.cpu_s, 1)} s of CPU in "
                f"this run against {f.say('truncation_cpu_s', trunc.cpu_s, 1)} s for "
                "truncation's replay and answers",
            )
        )
    compact = r.outcome("compact")
    if compact is not None and tiered is not None and discard is not None:
        res.gains.append(_discard_gain(f, compact, tiered, discard, n))
    from ctxlab.memory import LOOP_NOTE

    for o in r.outcomes:
        lost = r.lost(o)
        res.notes.append(
            f"Facts that cannot be reconstructed under {LABELS[o.strategy]}: "
            + (", ".join(f"`{x}`" for x in lost) if lost else "none")
            + (
                " (the log keeps every message, so a search could still find the rest)."
                if o.keeps_log
                else " (the evicted turns were deleted: only the summary speaks for them)."
            )
        )
    res.notes.append(
        "Recoverable is what a search of the message log could still bring back: the memory "
        "layer writes every message to its recall store, and every strategy but compaction "
        "keeps it there, so truncation and the summary could be extended to search it; only "
        "tiered memory does so by itself, which the 'in the prompt when asked' column shows."
    )
    res.notes.append(
        "A compacted prompt is judged by the answers it still supports: tokens saved say "
        "nothing about which facts survived, and a fact kept in the prompt is not yet a "
        "fact the model uses."
    )
    res.notes.append(f"The memory loop here is the {LOOP_NOTE}.")


def _discard_gain(f: Figures, compact: Outcome, tiered: Outcome, d: Discard, n: int) -> Gain:
    """Compaction that deletes the log against tiered memory, paired over the same facts
    (compared in `verdicts`)."""
    word = {"held": "fewer, beyond noise", "failed": "more, beyond noise"}.get(
        d.verdict, "a difference within noise"
    )
    return Gain(
        "compaction that deletes the log, against tiered memory",
        f"the summary replaced the history in "
        f"{f.say('tokens_after_compact', compact.tokens_after)} tokens and the evicted "
        "turns were deleted, so no search can bring them back: "
        f"{f.say('lost_compact', compact.count('lost'))} of {f.say('facts', n)} facts "
        f"lost against {f.say('lost_tiered', tiered.count('lost'))} under tiered memory "
        f"({word}: paired 95 % interval of the change in facts kept "
        f"[{f.say('kept_change_low_pct', 100 * d.kept_change.low, 1)}, "
        f"{f.say('kept_change_high_pct', 100 * d.kept_change.high, 1)}] points)",
        f"answers right: {f.say('accuracy_compact', 100 * compact.accuracy, 1)}% "
        f"against {f.say('accuracy_tiered', 100 * tiered.accuracy, 1)}% (paired 95 % "
        f"interval of the change [{f.say('answers_change_low_pct', 100 * d.answers_change.low, 1)}"
        f", {f.say('answers_change_high_pct', 100 * d.answers_change.high, 1)}] points over the "
        f"same {n} facts); what compaction drops is gone for every later question, not only "
        "for this one",
    )


def draw(counts: dict[str, dict[str, float]], ceiling: float | None, path: Path) -> Path:
    """Per strategy: where the planted facts are (stacked), and what reached the answer."""
    from ctxlab.workshop.plots import figure, save

    fig, (left, right) = figure(8.5, 3.6)
    labels = [name.replace(" (", "\n(") for name in counts]
    xs = list(range(len(counts)))
    bottom = [0.0] * len(xs)
    for status, colour in (
        ("in context", "tab:green"),
        ("recoverable", "tab:orange"),
        ("lost", "tab:red"),
    ):
        ys = [c[status] for c in counts.values()]
        left.bar(xs, ys, bottom=bottom, color=colour, label=status)
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    left.set_ylabel("planted facts")
    left.set_title("where the facts are after compaction")
    facts = max(bottom) or 1
    width = 0.4
    right.bar(
        [x - width / 2 for x in xs],
        [100 * c["in prompt"] / facts for c in counts.values()],
        width,
        color="tab:blue",
        label="answer in the prompt when asked",
    )
    acc = [c["accuracy_pct"] for c in counts.values()]
    err = None
    if all("accuracy_low_pct" in c and "accuracy_high_pct" in c for c in counts.values()):
        err = [
            [a - c["accuracy_low_pct"] for a, c in zip(acc, counts.values(), strict=True)],
            [c["accuracy_high_pct"] - a for a, c in zip(acc, counts.values(), strict=True)],
        ]
    right.bar(
        [x + width / 2 for x in xs],
        acc,
        width,
        yerr=err,
        capsize=3,
        color="tab:purple",
        label="answered right (95 % interval)" if err else "answered right",
    )
    if ceiling is not None:
        right.axhline(ceiling, color="grey", linestyle="--", label="model's ceiling")
    right.set_ylabel("% of facts")
    right.set_ylim(0, 100)
    right.set_title("what the strategy brought back")
    for ax in (left, right):
        ax.set_xticks(xs, labels, fontsize=7)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    return save(fig, path)


# -- declarations ---------------------------------------------------------------------------


class CompactionSection(Section):
    strategies: list[
        Literal["truncation", "summary", "summary-extractive", "tiered", "compact"]
    ] = Field(min_length=1)
    sessions: Annotated[int, Field(ge=2)]
    turns_per_session: Annotated[int, Field(ge=3)]
    facts: Annotated[int, Field(ge=1, le=10)]
    window_tokens: Annotated[int, Field(ge=64)]
    reserve_tokens: Pos
    note_position: Literal["system", "turn"]
    summary_tokens: Annotated[int, Field(ge=8)]
    search_k: Pos
    retriever: Literal["bm25", "dense", "hybrid"]
    answer_tokens: Pos
    ceiling: bool
    fixture_seed: Seed

    @field_validator("strategies")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError("strategies must be distinct")
        return names

    @model_validator(mode="after")
    def _budget(self) -> CompactionSection:
        if self.reserve_tokens + self.answer_tokens > self.window_tokens // 2:
            raise ValueError(
                f"reserve_tokens {self.reserve_tokens} and answer_tokens {self.answer_tokens} "
                f"leave less than half of window_tokens {self.window_tokens} for the context"
            )
        if self.answer_tokens > self.reserve_tokens:
            raise ValueError(
                f"answer_tokens {self.answer_tokens} exceeds the output reserve_tokens "
                f"{self.reserve_tokens}"
            )
        return self


_TRUNC, _TIERED = "truncation", "tiered memory with an archive"
METRICS = (
    Metric(
        "facts_in_context", "facts", _TRUNC, _TIERED, "planted facts still in the compacted context"
    ),
    Metric(
        "facts_recoverable",
        "facts",
        _TRUNC,
        _TIERED,
        "planted facts out of the context that a search of the message log brings back",
    ),
    Metric("facts_lost", "facts", _TRUNC, _TIERED, "planted facts neither in context nor found"),
    Metric(
        "facts_in_prompt",
        "facts",
        _TRUNC,
        _TIERED,
        "planted facts whose answer is in the prompt the strategy builds for the fact's question",
    ),
    Metric("answer_accuracy_pct", "%", _TRUNC, _TIERED, "accuracy on the facts' questions"),
    Metric("context_tokens", "tokens", _TRUNC, _TIERED, "tokens in the compacted context"),
)

TOML = """\
# -- 5: compaction: what a strategy keeps, what a search brings back, what is lost ------------
[compaction]
strategies = ["truncation", "summary", "tiered", "compact"]  # also: "summary-extractive"
sessions = 4                  # the seeded conversation: weekly sessions of small talk ...
turns_per_session = 9         # ... of this many user turns each (a reply after each) ...
facts = 10                    # ... with this many planted facts (one corrected later), 1 to 10
window_tokens = 1024          # the context window the history is compacted into
reserve_tokens = 64           # output reserved out of it: the prompt budget is the rest
note_position = "system"      # where the summary or recall note sits: system or turn
summary_tokens = 64           # longest summary the model writes ("summary" strategy)
search_k = 3                  # a fact is recoverable when a search of the message log for
retriever = "hybrid"          # its question returns its message in the top search_k
answer_tokens = 16            # each fact's question is answered greedily, at most this long
ceiling = true                # also ask each question with only its own message (model limit)
fixture_seed = 0
"""

PREDICTIONS_TOML = """\
[predictions.compaction]      # baseline: truncation; observed: tiered memory
# Recall memory keeps every message under every strategy and both are classified by the same
# search of that log, so what a search can still bring back does not depend on the strategy;
# what differs is whether the strategy itself brings the stating message back when asked.
facts_lost = { direction = "unchanged", tolerance = 0.0 }
facts_in_prompt = { direction = "up" }
answer_accuracy_pct = { direction = "up" }
# both compact at 90% of the same budget down to 70% of it (tiered also writes a short note):
# within 50% of each other, and never past the budget (window_tokens - reserve_tokens)
context_tokens = { direction = "unchanged", tolerance = 0.5, range = [0, 960] }
"""

QUICK_TOML = """\
[quick.compaction]
sessions = 2
turns_per_session = 5
facts = 4
window_tokens = 384
reserve_tokens = 32
summary_tokens = 32
answer_tokens = 12
ceiling = false

[quick.predictions.compaction]
facts_lost = { direction = "unchanged", tolerance = 0.0 }
facts_in_prompt = { direction = "up" }
context_tokens = { direction = "unchanged", tolerance = 0.5, range = [0, 352] }
"""


def check(c: CompactionSection, cfg: CommonConfig) -> None:
    fits(cfg, "compaction.window_tokens", c.window_tokens)


def _guard_summaries(f: FigureValues) -> tuple[str, str]:
    names = [k.removeprefix("accuracy_") for k in f if k.startswith("accuracy_")]
    per = "; ".join(
        f"{name}: {fmt(f[f'tokens_after_{name}'])} tokens, {fmt(f[f'in_prompt_{name}'])} of "
        f"{fmt(f['facts'])} answers in the prompt when asked, {fmt(f[f'accuracy_{name}'], 1)}% "
        "answered right"
        for name in names
    )
    return "guarded", (
        f"demonstration {DEMO.number} judges each strategy by the planted facts it kept, the "
        f"ones a search still finds and the ones lost, and by the answers, beside its tokens "
        f"({per})"
    )


DEMO = Demonstration(
    number=5,
    key="compaction",
    title="Compact a history: what cannot be reconstructed",
    section=CompactionSection,
    metrics=METRICS,
    layers=("task", "cost"),
    steps=steps,
    run=run,
    toml=TOML,
    predictions_toml=PREDICTIONS_TOML,
    quick_toml=QUICK_TOML,
    guards=((Risk.SUMMARIES, _guard_summaries),),
    check=check,
    required=("facts_lost",),
    plots=(
        Plot(
            "5_compaction.png",
            "per strategy, where the planted facts are and what reached the answer",
        ),
    ),
    server=ServerMode(through=True, chat=True),
)
