"""Demonstration 6: retrieval depth k: what each k retrieves, answers, puts in context, costs.

The seeded corpus of the retrieval layer (`ctxlab.rag.corpus_fixture`: made-up organisations
in versioned documents, 100 gold questions with their evidence sentences) is ingested once
into a temporary SQLite store. Retrieval is measured over every question at every k without
the model (recall@k, MRR, the tokens the passages add to the prompt, the hosted price): it is
cheap, so it covers all of them. Answering needs one model call per question per k; the
default run answers a seeded subset of 32 (the same questions at every k, to fit `make
run`'s ten minutes), `--full` every question and `--quick` 4, with the size beside every
figure. Each proportion carries its 95 % interval, and k is compared with k over the same
questions (paired: `ctxlab.stats`), so a
best k is claimed only when it is beyond the noise. More passages
can only find more evidence (the top k are nested), but they also bury it in more text for
a small model: the demonstration measures both rather than assuming either.

The file is in three parts: `measure` returns frozen records (`Records`, one `Depth` per k,
defined in `retrieval_depth_report.py`), `verdicts` records the observations the predictions
are judged on (the one place it judges), and the tables, gains and notes are rendered from
the records by `retrieval_depth_report.py` (the plot here).
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, model_validator

from ctxlab.progress import Tracker
from ctxlab.workshop import retrieval_depth_report as report
from ctxlab.workshop.config import Pos, Section, Seed
from ctxlab.workshop.demonstration import (
    ContextNumber,
    Demonstration,
    FigureValues,
    Metric,
    Plot,
    Risk,
    ServerMode,
)
from ctxlab.workshop.measure import Timer
from ctxlab.workshop.result import DemoResult, JSONObject, fmt
from ctxlab.workshop.retrieval_depth_report import Depth, Records, Scores, paired_pct, pct
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from ctxlab.rag.answer import Answer
    from ctxlab.rag.corpus import GoldQuestion
    from ctxlab.rag.retriever import CorpusRetriever, Passage


def score(questions: list[GoldQuestion], answers: list[Answer], evidence: dict) -> Scores:
    """Accuracy and citation quality of `answers`, as the retrieval layer defines them."""
    from ctxlab.memory.scoring import answer_match
    from ctxlab.rag.metrics import citation_precision, citation_recall, mean

    pairs = list(zip(questions, answers, strict=True))
    correct = tuple(answer_match(a.text, [q.answer]) for q, a in pairs)
    precisions = tuple(
        p for q, a in pairs if (p := citation_precision(a.citations, evidence[q.id])) is not None
    )
    return Scores(
        correct=correct,
        precisions=precisions,
        accuracy=mean([float(c) for c in correct]),
        citation_precision=mean(list(precisions)) if precisions else None,
        citation_recall=mean([citation_recall(a.citations, evidence[q.id]) for q, a in pairs]),
        cited_by_model=mean([float(a.cited_by == "model") for a in answers]),
    )


def _gold(retriever: CorpusRetriever, key: str) -> Passage:
    doc, chunk = key.rsplit("#", 1)
    return retriever.passage(doc, int(chunk))


def steps(session: Session) -> int:
    c = DEMO.config(session.cfg)
    batches = -(-c.answer_questions // session.cfg.engine.max_num_seqs)
    return 1 + batches * len(c.k_values) + (1 if c.gold_row else 0)


def subset(questions: list[GoldQuestion], n: int, seed: int) -> list[GoldQuestion]:
    """A seeded sample of `n` questions, kept in the fixture's order."""
    picked = set(random.Random(seed).sample(range(len(questions)), n))
    return [q for i, q in enumerate(questions) if i in picked]


def measure(session: Session, tracker: Tracker) -> Records:
    """Retrieval over every question at every k, then answers on the seeded subset (and the
    gold passages alone when asked): counts, scores and seconds, nothing formatted."""
    from ctxlab.memory.embed import WordLlamaEmbedder
    from ctxlab.memory.engine_backend import EngineBackend
    from ctxlab.memory.store import open_store
    from ctxlab.rag import (
        CorpusFixture,
        CorpusRetriever,
        answer_questions,
        corpus_fixture,
    )
    from ctxlab.rag.answer import answer_chat
    from ctxlab.rag.evaluate import evaluate, evidence_chunks
    from ctxlab.rag.metrics import recall_at_k
    from ctxlab.rag.retriever import order_passages

    c, cost = DEMO.config(session.cfg), session.cfg.cost
    fx = corpus_fixture(c.fixture_seed)
    asked = fx.questions[: c.questions]
    answered = subset(asked, c.answer_questions, c.fixture_seed)
    prices = cost.card()
    embedder = WordLlamaEmbedder()
    depths: dict[int, Depth] = {}  # retrieval only, until the answers are scored
    with (
        tempfile.TemporaryDirectory(prefix="ctxlab-workshop-rag-") as tmp,
        open_store(Path(tmp) / "rag.db") as store,
    ):
        # 1. retrieval, tokens and price over every question: the tokenizer, no model call
        counter = EngineBackend(session.loaded, session.cfg.model.max_model_len)
        whole = evaluate(
            counter,
            store,
            embedder=embedder,
            corpus=CorpusFixture(fx.docs, asked, fx.seed),
            ks=tuple(c.k_values),
            retrievers=(c.retriever,),
            answer_retrievers=(),
            gold_row=False,
            answers=False,  # no model: answer_tokens stands in for the answer's length
            order=c.order,
            answer_tokens=c.answer_tokens,
            prices=prices,
            seed=c.fixture_seed,
            cost_samples=0,
            show_progress=False,
        )
        retriever = CorpusRetriever(store, embedder)
        ranked = {q["id"]: q[f"ranked {c.retriever}"] for q in whole.per_question}
        ev_all = {q.id: evidence_chunks(store, q) for q in asked}
        bare = [counter.count_tokens(answer_chat(q.question, [])) for q in asked]
        for row, money in zip(whole.retrieval, whole.cost, strict=True):
            prompts = [
                counter.count_tokens(
                    answer_chat(
                        q.question,
                        order_passages(retriever.search(q.question, row.k, c.retriever), c.order),
                    )
                )
                for q in asked
            ]
            depths[row.k] = Depth(
                row.k,
                row.recall,
                row.mrr,
                money.prompt_tokens,
                sum(p - b for p, b in zip(prompts, bare, strict=True)) / len(asked),
                max(prompts),
                money.dollars_per_1k_questions,
                recalls=tuple(recall_at_k(ranked[q.id], ev_all[q.id], row.k) for q in asked),
            )
        chunks = retriever.chunk_count()
        tracker.advance()
        # 2. answers on the seeded subset, the same questions at every k; per batch of
        # questions the smaller k goes first, so a larger k's prompt, which starts with the
        # smaller k's passages (the top k are nested), finds them in the prefix cache
        # questions go in batches of the engine's max_num_seqs; the pool holds a batch at
        # two depths: the k answered and the one before it
        batch = session.cfg.engine.max_num_seqs
        two = sorted(d.max_prompt_tokens + c.answer_tokens for d in depths.values())[-2:]
        backend = session.requests.chat((batch + 1) * sum(two), batch)
        evidence = {q.id: evidence_chunks(store, q) for q in answered}
        got: dict[int, list[Answer]] = {k: [] for k in depths}
        spent = {k: [0.0, 0.0, 0, 0] for k in depths}  # cpu s, wall s, prompt, reused
        for start in range(0, len(answered), batch):
            part = answered[start : start + batch]
            for k in depths:
                found = [
                    order_passages(retriever.search(q.question, k, c.retriever), c.order)
                    for q in part
                ]
                backend.log.clear()
                with Timer() as t:
                    got[k] += answer_questions(
                        backend, [q.question for q in part], found, c.answer_tokens
                    )
                (call,) = backend.log.calls
                spent[k][0] += t.cpu_s
                spent[k][1] += t.wall_s
                spent[k][2] += call.prompt_tokens
                spent[k][3] += call.reused_tokens
                tracker.advance()
        n = len(answered)
        for k, d in depths.items():
            sc = score(answered, got[k], evidence)
            depths[k] = replace(
                d,
                accuracy=sc.accuracy,
                citation_precision=sc.citation_precision,
                citation_recall=sc.citation_recall,
                cited_by_model=sc.cited_by_model,
                answer_cpu_s=spent[k][0] / n,
                answer_wall_s=spent[k][1] / n,
                answer_prompt_tokens=spent[k][2] / n,
                answer_reused_tokens=spent[k][3] / n,
                correct=sc.correct,
                precisions=sc.precisions,
            )
        gold = None
        if c.gold_row:
            passages = [[_gold(retriever, min(keys)) for keys in evidence[q.id]] for q in answered]
            gold_answers = []
            for start in range(0, len(answered), batch):
                gold_answers += answer_questions(
                    backend,
                    [q.question for q in answered[start : start + batch]],
                    passages[start : start + batch],
                    c.answer_tokens,
                )
            sc = score(answered, gold_answers, evidence)
            gold = Depth(
                0, 0.0, 0.0, 0.0, 0.0, 0, 0.0,
                accuracy=sc.accuracy,
                citation_precision=sc.citation_precision,
                citation_recall=sc.citation_recall,
                cited_by_model=sc.cited_by_model,
                correct=sc.correct,
                precisions=sc.precisions,
            )  # fmt: skip
            tracker.advance()
    return Records(tuple(depths.values()), gold, len(asked), len(answered), len(fx.docs), chunks)


PAIRED = "paired bootstrap over the same questions"


def verdicts(r: Records, res: DemoResult) -> None:
    """The metrics the run's predictions are judged on (`res.observe`), baseline at the
    smallest k and observed at the largest, recall and accuracy with the paired interval of
    their change: the one place this demonstration judges (the report's "best k beyond
    noise" sentence reads the same paired intervals)."""
    lo, hi = r.lo, r.hi
    res.observe(
        "recall_at_k_pct",
        100 * lo.recall,
        100 * hi.recall,
        1,
        change=paired_pct(lo.recalls, hi.recalls),
        test=f"{PAIRED}, {len(lo.recalls)} questions",
    )
    res.observe("citation_precision_pct", pct(lo.citation_precision), pct(hi.citation_precision), 1)
    res.observe("citation_recall_pct", pct(lo.citation_recall), pct(hi.citation_recall), 1)
    res.observe(
        "answer_accuracy_pct",
        pct(lo.accuracy),
        pct(hi.accuracy),
        1,
        change=paired_pct(lo.correct, hi.correct) if lo.correct else None,
        test=f"{PAIRED}, {len(lo.correct)} questions",
    )
    res.observe("context_tokens_per_question", lo.retrieved_tokens, hi.retrieved_tokens, 1)
    res.observe("cost_per_question_usd", lo.usd_per_1000 / 1000, hi.usd_per_1000 / 1000, 8)


def run(session: Session, tracker: Tracker) -> DemoResult:
    """Measure, render the tables, judge, then the prose and the plot from the records."""
    records = measure(session, tracker)
    res = DemoResult.of(DEMO, "run", "measured")
    report.tables(session, res, records)
    verdicts(records, res)
    report.explain(session, res, records)
    res.plots.append(
        draw(
            [report.plot_row(d) for d in records.depths],
            DEMO.plot("6_retrieval_depth.png").path(session.out),
        )
    )
    return res


def draw(rows: list[JSONObject], path: Path) -> Path:
    """Per k: evidence found, answers right and citations right (left); tokens added (right)."""
    from ctxlab.workshop.plots import figure, save

    fig, (left, right) = figure()
    ks = [r["k"] for r in rows]
    for key, label, marker in (
        ("recall_pct", "recall@k", "o"),
        ("accuracy_pct", "accuracy", "s"),
        ("citation_precision_pct", "citation precision", "^"),
    ):
        got = [r for r in rows if r[key] is not None]
        if not got:
            continue
        stem = key.removesuffix("_pct")
        low, high = f"{stem}_low_pct", f"{stem}_high_pct"
        if all(r.get(low) is not None and r.get(high) is not None for r in got):
            err = [[r[key] - r[low] for r in got], [r[high] - r[key] for r in got]]
            left.errorbar(
                [r["k"] for r in got],
                [r[key] for r in got],
                yerr=err,
                marker=marker,
                capsize=3,
                label=f"{label} (95 % interval)",
            )
        else:
            left.plot([r["k"] for r in got], [r[key] for r in got], marker=marker, label=label)
    left.set_xscale("log", base=2)
    left.set_xticks(ks, [str(k) for k in ks])
    left.set_ylim(0, 100)
    left.set_xlabel("k (passages retrieved)")
    left.set_ylabel("%")
    left.set_title("what k finds and what the model does with it")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    right.bar([str(k) for k in ks], [r["retrieved_tokens"] for r in rows], color="tab:grey")
    right.set_xlabel("k")
    right.set_ylabel("retrieved tokens per question")
    right.set_title("what k puts in the prompt")
    right.grid(alpha=0.3, axis="y")
    return save(fig, path)


# -- declarations ---------------------------------------------------------------------------


class RetrievalSection(Section):
    k_values: list[Pos] = Field(min_length=1)
    retriever: Literal["bm25", "dense", "hybrid"]
    questions: Annotated[int, Field(ge=1, le=100)]  # the fixture has 100 gold questions
    answer_questions: Pos
    answer_tokens: Pos
    order: Literal["relevance", "edges"]
    gold_row: bool
    fixture_seed: Seed

    @model_validator(mode="after")
    def _shape(self) -> RetrievalSection:
        if sorted(set(self.k_values)) != self.k_values:
            raise ValueError("k_values must be distinct and in increasing order")
        if self.answer_questions > self.questions:
            raise ValueError(
                f"answer_questions {self.answer_questions} is more than the {self.questions} "
                "questions retrieval is measured on"
            )
        return self


_KMIN, _KMAX = "smallest k", "largest k"
METRICS = (
    Metric("recall_at_k_pct", "%", _KMIN, _KMAX, "evidence sentences found in the top k"),
    Metric("citation_precision_pct", "%", _KMIN, _KMAX, "cited chunks that are gold"),
    Metric("citation_recall_pct", "%", _KMIN, _KMAX, "gold chunks that are cited"),
    Metric("answer_accuracy_pct", "%", _KMIN, _KMAX, "answers matching the gold answer"),
    Metric(
        "context_tokens_per_question",
        "tokens",
        _KMIN,
        _KMAX,
        "tokens the retrieved passages add to the prompt",
    ),
    Metric("cost_per_question_usd", "USD", _KMIN, _KMAX, "hosted price of one question"),
)

TOML = """\
# -- 6: retrieval depth k --------------------------------------------------------------------
[retrieval_depth]
k_values = [1, 2, 4, 8]
retriever = "bm25"            # bm25, dense or hybrid (bm25: see docs/statistics.md)
questions = 100               # gold questions of the seeded corpus: recall, tokens and cost over
                              # all of them at every k
answer_questions = 32         # questions answered by the model at every k: a seeded subset,
                              # the same questions at every k (--full: all 100, +3 min on 2 cores)
answer_tokens = 16            # greedy answers of at most this many tokens
order = "relevance"           # passages best first, or "edges" (against lost in the middle)
gold_row = false              # also answer the subset from its gold passages alone (the
                              # model's ceiling; one more model call per question)
fixture_seed = 0
"""

PREDICTIONS_TOML = """\
[predictions.retrieval_depth] # baseline: smallest k; observed: largest k
# the top k are nested (the top 8 hold the top 1), so recall and tokens can only grow with k
recall_at_k_pct = { direction = "up" }
context_tokens_per_question = { direction = "up" }
cost_per_question_usd = { direction = "up" }
"""

QUICK_TOML = """\
[quick.retrieval_depth]
k_values = [1, 4]
answer_questions = 4          # --quick: a seeded subset of 4 questions, said so in the report
answer_tokens = 12
"""


FULL_TOML = """\
[full.retrieval_depth]
answer_questions = 100        # every gold question answered at every k (intervals ~+-10 points)
"""


def _guard_recall_only(f: FigureValues) -> tuple[str, str]:
    return "guarded", (
        f"demonstration {DEMO.number} reports answer accuracy and citation precision beside "
        f"recall@k: recall {fmt(f['recall_lo_pct'], 1)}% -> {fmt(f['recall_hi_pct'], 1)}% over "
        f"all {fmt(f['questions'])} questions, accuracy {fmt(f['accuracy_lo_pct'], 1)}% -> "
        f"{fmt(f['accuracy_hi_pct'], 1)}% and citation precision "
        f"{fmt(f['citation_precision_lo_pct'], 1)}% -> {fmt(f['citation_precision_hi_pct'], 1)}% "
        + (
            f"on all {fmt(f['answered'])} questions"
            if f["answered"] == f["questions"]
            else f"on a seeded subset of {fmt(f['answered'])}"
        )
        + ", smallest k to largest"
    )


DEMO = Demonstration(
    number=6,
    key="retrieval_depth",
    title="Retrieval depth k",
    section=RetrievalSection,
    metrics=METRICS,
    layers=("retrieval", "task", "cost"),
    steps=steps,
    run=run,
    toml=TOML,
    predictions_toml=PREDICTIONS_TOML,
    quick_toml=QUICK_TOML,
    full_toml=FULL_TOML,
    guards=((Risk.RECALL_ONLY, _guard_recall_only),),
    required=("recall_at_k_pct",),
    plots=(
        Plot(
            "6_retrieval_depth.png",
            "per k, evidence found, answers and citations right, and tokens added",
        ),
    ),
    server=ServerMode(through=True, chat=True),
    context_numbers=(
        ContextNumber(
            "retrieved tokens",
            "retrieved_tokens",
            "tokens retrieval put into the prompt per question",
        ),
    ),
)
