"""The report of demonstration 6 (retrieval depth k): its records, tables, gains and notes.

`demo_retrieval_depth.py` measures into the frozen records defined here (`Records`, one
`Depth` per k) and judges them; this module only turns those records into what the
workshop prints. The split keeps the measurement (what each k retrieves, answers and costs)
readable on its own, and the wording of the report (which layer each table belongs to,
which figure each sentence takes from `res.figures`) in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxlab import stats
from ctxlab.stats import Interval
from ctxlab.workshop.result import Column, DemoResult, Figures, Gain, Table
from ctxlab.workshop.session import Session


@dataclass(frozen=True)
class Scores:
    """Answers scored as the retrieval layer defines it (`demo_retrieval_depth.score`)."""

    correct: tuple[bool, ...]  # per answered question, in order
    precisions: tuple[float, ...]  # citation precision per answer that cites
    accuracy: float
    citation_precision: float | None  # None: no answer cited
    citation_recall: float
    cited_by_model: float


@dataclass(frozen=True)
class Depth:
    """Everything measured at one k (the gold-passage ceiling is a `Depth` at k = 0 with
    only its answers' fields)."""

    k: int
    recall: float  # mean recall@k over every question
    mrr: float
    prompt_tokens: float  # mean prompt tokens of a question's answer prompt, every question
    retrieved_tokens: float  # mean tokens the passages add to that prompt
    max_prompt_tokens: int
    usd_per_1000: float  # hosted price of 1,000 questions (prompt + answer)
    accuracy: float | None = None  # on the answered subset
    citation_precision: float | None = None
    citation_recall: float | None = None
    cited_by_model: float | None = None
    answer_cpu_s: float | None = None  # CPU seconds per answered question
    answer_wall_s: float | None = None
    answer_prompt_tokens: float | None = None  # per answered question
    answer_reused_tokens: float | None = None  # of those, served by the prefix cache
    recalls: tuple[float, ...] = ()  # recall@k per question, every question
    correct: tuple[bool, ...] = ()  # per answered question, in order
    precisions: tuple[float, ...] = ()  # per answer that cites


@dataclass(frozen=True)
class Records:
    """What demonstration 6 measured; every table, verdict and sentence reads these."""

    depths: tuple[Depth, ...]  # one per k, in increasing k
    gold: Depth | None  # the gold passages alone, when the config asks
    questions: int  # gold questions retrieval was measured on
    answered: int  # of them, answered by the model at every k
    documents: int  # document versions in the corpus
    chunks: int

    @property
    def lo(self) -> Depth:
        return self.depths[0]

    @property
    def hi(self) -> Depth:
        return self.depths[-1]


def pct(x: float | None) -> float | None:
    """A share as a percentage; None (not measured) stays None."""
    return None if x is None else 100 * x


def recall_ci(d: Depth) -> Interval:
    return stats.mean_interval(d.recalls)


def accuracy_ci(d: Depth) -> Interval | None:
    return stats.proportion(d.correct) if d.correct else None


def _pct_interval(ci: Interval | None) -> tuple[float | None, float | None]:
    if ci is None or ci.n == 0:
        return None, None
    return 100 * ci.low, 100 * ci.high


def paired_pct(a: list[float] | list[bool], b: list[float] | list[bool]) -> Interval:
    """The change from a to b over the same questions, in percentage points."""
    p = stats.paired([float(x) for x in a], [float(x) for x in b]).change
    return Interval(100 * p.value, 100 * p.low, 100 * p.high, p.n, p.method)


def plot_row(d: Depth) -> dict[str, Any]:
    """One k as the plot reads it (`demo_retrieval_depth.draw`): values and 95 % intervals."""
    r_lo, r_hi = _pct_interval(recall_ci(d))
    a_lo, a_hi = _pct_interval(accuracy_ci(d))
    p_lo, p_hi = _pct_interval(stats.mean_interval(d.precisions) if d.precisions else None)
    return {
        "k": d.k,
        "recall_pct": 100 * d.recall,
        "recall_low_pct": r_lo,
        "recall_high_pct": r_hi,
        "accuracy_pct": pct(d.accuracy),
        "accuracy_low_pct": a_lo,
        "accuracy_high_pct": a_hi,
        "citation_precision_pct": pct(d.citation_precision),
        "citation_precision_low_pct": p_lo,
        "citation_precision_high_pct": p_hi,
        "retrieved_tokens": d.retrieved_tokens,
    }


def tables(session: Session, res: DemoResult, r: Records) -> None:
    """Three tables, one per layer: retrieval (all questions), task (the answered
    subset, with the gold-passage ceiling), cost."""
    c, money = session.cfg.retrieval_depth, session.cfg.cost.currency
    n_all, n_answered, gold = r.questions, r.answered, r.gold
    retrieval = Table(
        "retrieval_depth_retrieval",
        "retrieval",
        f"Demonstration 6: {c.retriever} retrieval at each k over all {n_all} gold questions",
        "measured",
        [
            Column("k"),
            Column("questions"),
            Column("recall@k %", 1),
            Column("95 % interval low", 1),
            Column("95 % interval high", 1),
            Column("MRR@k", 3),
            Column("retrieved tokens per question", 1),
        ],
        note=f"{r.documents} document versions cut into {r.chunks} chunks, newest "
        "versions searched; recall@k: share of a question's evidence sentences held by a chunk "
        "in the top k (95 % interval: Wilson where every question has one evidence sentence, "
        "else a bootstrap of the mean); retrieved tokens: what the k passages add to the prompt "
        "(chat template counted, the same prompt without passages subtracted)",
    )
    task = Table(
        "retrieval_depth_task",
        "task",
        f"Demonstration 6: answers at each k on all {n_all} questions"
        if n_answered == n_all
        else f"Demonstration 6: answers at each k on a seeded subset of {n_answered} of the "
        f"{n_all} questions",
        "measured",
        [
            Column("setting"),
            Column("questions answered"),
            Column("answers right"),
            Column("accuracy %", 1),
            Column("95 % interval low", 1),
            Column("95 % interval high", 1),
            Column("citation precision %", 1),
            Column("citation recall %", 1),
            Column("citations written by the model %", 1),
        ],
        note=f"the same {n_answered} questions (seed {c.fixture_seed}) at every k, greedy "
        f"answers of at most {c.answer_tokens} tokens, passages in {c.order} order; accuracy: "
        "the gold answer as whole words in the answer; citations the model did not write are "
        "attributed to the passage holding the most answer words; precision over answers "
        "that cite; accuracy's 95 % interval is Wilson's"
        + ("" if n_answered == n_all else ". A seeded subset: each answer is a model call per k"),
    )
    costs = Table(
        "retrieval_depth_cost",
        "cost",
        f"Demonstration 6: what one question costs at each k (all {n_all} questions)",
        "measured",
        [
            Column("k"),
            Column("prompt tokens per question", 1),
            Column("longest prompt"),
            Column(f"hosted {money} per 1,000 questions", 4),
            Column("prompt tokens reused per answered question", 1),
            Column("CPU s per answered question", 2),
        ],
        note=f"hosted: the configured input and output prices over the exact prompt tokens "
        f"and {c.answer_tokens} output tokens, every question; the last two columns are the "
        f"{n_answered} answered questions on this engine, in batches of the engine's "
        f"{session.cfg.engine.max_num_seqs}, each k after "
        "the smaller ones: a larger k's prompt starts with the smaller k's passages, so the "
        "prefix cache serves them (reused) and the CPU seconds are those of the rest, not of "
        "the prompt answered alone",
    )
    for d in r.depths:
        retrieval.add(
            d.k, n_all, 100 * d.recall, *_pct_interval(recall_ci(d)), d.mrr, d.retrieved_tokens
        )
        task.add(
            f"{c.retriever}@{d.k}",
            n_answered,
            sum(d.correct),
            pct(d.accuracy),
            *_pct_interval(accuracy_ci(d)),
            pct(d.citation_precision),
            pct(d.citation_recall),
            pct(d.cited_by_model),
        )
        costs.add(
            d.k,
            d.prompt_tokens,
            d.max_prompt_tokens,
            d.usd_per_1000,
            d.answer_reused_tokens,
            d.answer_cpu_s,
        )
    if gold is not None:
        task.add(
            "gold passages only (the model's ceiling)",
            n_answered,
            sum(gold.correct),
            pct(gold.accuracy),
            *_pct_interval(accuracy_ci(gold)),
            pct(gold.citation_precision),
            pct(gold.citation_recall),
            pct(gold.cited_by_model),
        )
    res.tables += [retrieval, task, costs]


def explain(session: Session, res: DemoResult, r: Records) -> None:
    """Summary, gains and notes; every number in them comes from `res.figures.say`."""
    c, f, money = session.cfg.retrieval_depth, res.figures, session.cfg.cost.currency
    n_all, n_answered, gold, lo, hi = r.questions, r.answered, r.gold, r.lo, r.hi
    depths = r.depths
    best = max(depths, key=lambda d: (d.accuracy or 0.0, -d.k))
    # best k beyond noise: its paired change against every other k is above zero
    against = {
        d.k: paired_pct(d.correct, best.correct)
        for d in depths
        if d.k != best.k and d.correct and best.correct
    }
    clear = bool(against) and all(ci.low > 0 for ci in against.values())
    closest = min(against.items(), key=lambda kv: kv[1].low) if against else None
    for d in depths:
        f.say(f"recall_k{d.k}_pct", 100 * d.recall, 1)
        f.say(f"accuracy_k{d.k}_pct", pct(d.accuracy), 1)
        f.say(f"retrieved_tokens_k{d.k}", d.retrieved_tokens, 1)
    f.say("retrieved_tokens", round(hi.retrieved_tokens))
    res.summary = (
        f"The seeded corpus ({f.say('documents', r.documents)} document versions, "
        f"{f.say('chunks', r.chunks)} chunks) and its {f.say('questions', n_all)} gold "
        f"questions: {c.retriever} retrieval at k = "
        f"{', '.join(str(d.k) for d in depths)} over every question; answers "
        + (
            f"to all {f.say('answered', n_answered)} questions at every k."
            if n_answered == n_all
            else f"on a seeded subset of {f.say('answered', n_answered)} questions at every k."
        )
    )
    ceiling = ""
    if gold is not None:
        ceiling = (
            f"; with only the gold passages the model answers "
            f"{f.say('gold_accuracy_pct', pct(gold.accuracy), 1)}% (its ceiling)"
        )
    res.gains.append(
        Gain(
            f"k = {hi.k} against k = {lo.k}",
            f"the prompt carries {f.say('retrieved_tokens_hi', hi.retrieved_tokens, 1)} "
            f"retrieved tokens per question instead of "
            f"{f.say('retrieved_tokens_lo', lo.retrieved_tokens, 1)}, and those passages hold "
            f"{f.say('recall_hi_pct', 100 * hi.recall, 1)}% of the evidence sentences instead "
            f"of {f.say('recall_lo_pct', 100 * lo.recall, 1)}% (all {n_all} questions)",
            f"on the {n_answered} answered questions accuracy goes from "
            f"{f.say('accuracy_lo_pct', pct(lo.accuracy), 1)}% to "
            f"{f.say('accuracy_hi_pct', pct(hi.accuracy), 1)}%, citation precision from "
            f"{f.say('citation_precision_lo_pct', pct(lo.citation_precision), 1)}% to "
            f"{f.say('citation_precision_hi_pct', pct(hi.citation_precision), 1)}%, and a "
            f"question's hosted price from {f.say('usd_1000_lo', lo.usd_per_1000, 4)} to "
            f"{f.say('usd_1000_hi', hi.usd_per_1000, 4)} {money} per 1,000{ceiling}; "
            + _best_sentence(f, best, clear, closest),
        )
    )
    beyond = hi.k in against and against[hi.k].low > 0
    if best.k != hi.k and best.accuracy is not None and hi.accuracy is not None and beyond:
        right_best = round(best.accuracy * n_answered)
        right_hi = round(hi.accuracy * n_answered)
        computed_hi = (hi.answer_prompt_tokens or 0) - (hi.answer_reused_tokens or 0)
        res.gains.append(
            Gain(
                f"k = {best.k} against k = {hi.k} (more context is not more answers)",
                f"k = {best.k} puts {f.say('retrieved_tokens_best', best.retrieved_tokens, 1)} "
                f"retrieved tokens in the prompt against "
                f"{f.say('retrieved_tokens_hi', hi.retrieved_tokens, 1)}, with "
                f"{f.say('recall_best_pct', 100 * best.recall, 1)}% of the evidence against "
                f"{f.say('recall_hi_pct', 100 * hi.recall, 1)}%; answered after the smaller k, "
                f"the k = {hi.k} prompt still computed "
                f"{f.say('computed_hi', computed_hi, 1)} of its "
                f"{f.say('answer_prompt_hi', hi.answer_prompt_tokens, 1)} tokens per answered "
                "question beyond what the prefix cache served",
                f"{f.say('right_best', right_best)} of {n_answered} answers right at k = "
                f"{best.k} against {f.say('right_hi', right_hi)} at k = {hi.k}, at "
                f"{f.say('usd_1000_best', best.usd_per_1000, 4)} instead of "
                f"{f.say('usd_1000_hi', hi.usd_per_1000, 4)} {money} per 1,000 questions; "
                f"the paired 95 % interval of the gain is "
                f"[{f.say('gain_best_low_pts', against[hi.k].low, 1)}, "
                f"{f.say('gain_best_high_pts', against[hi.k].high, 1)}] points over the same "
                f"{n_answered} questions",
            )
        )
    if n_answered < n_all:
        res.notes.append(
            f"Recall, MRR, tokens and hosted price are over all {n_all} questions; accuracy "
            f"and citations over a seeded subset of {n_answered} (the same questions at every "
            "k), because each answer is a model call per k. A subset this small moves in "
            f"steps of {f.say('step_pct', 100 / n_answered, 1)} points per question."
        )
    res.notes.append(
        "Every k is compared with every other over the same questions: the change in "
        "accuracy gets a 95 % interval from a paired bootstrap of the per-question "
        "differences (exact McNemar p beside it in docs/statistics.md); a best k is claimed "
        "only when that interval excludes zero against every other k."
    )
    res.notes.append(
        "Recall says the evidence reached the prompt, not that the model used it: read "
        "recall@k beside accuracy and citation quality, never alone."
    )


def _best_sentence(
    f: Figures, best: Depth, clear: bool, closest: tuple[int, Interval] | None
) -> str:
    """Which k answers best, claimed only beyond the noise of a paired comparison."""
    if closest is None:
        return f"the best accuracy here is at k = {f.say('best_k', best.k)}"
    k, ci = closest
    interval = (
        f"[{f.say('best_vs_next_low_pts', ci.low, 1)}, "
        f"{f.say('best_vs_next_high_pts', ci.high, 1)}] points"
    )
    if clear:
        return (
            f"k = {f.say('best_k', best.k)} answers best beyond noise: against the closest, "
            f"k = {k}, the paired 95 % interval of its gain is {interval}"
        )
    return (
        f"no k answers best beyond noise: the highest accuracy, at k = "
        f"{f.say('best_k', best.k)}, is within noise of k = {k} (paired 95 % interval of "
        f"the difference {interval}, which includes zero)"
    )
