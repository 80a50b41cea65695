"""Demonstration 6: retrieval depth k: what each k retrieves, answers, puts in context, costs.

The seeded corpus of the retrieval layer (`ctxlab.rag.corpus_fixture`: made-up organisations
in versioned documents, 100 gold questions with their evidence sentences) is ingested once
into a temporary SQLite store. Retrieval is measured over every question at every k without
the model (recall@k, MRR, the tokens the passages add to the prompt, the hosted price): it is
cheap, so it covers all of them. Answering needs one model call per question per k, so a
seeded subset of the questions (the same questions at every k) is answered; its accuracy
and citations are reported as that subset, with its size beside every figure. More passages
can only find more evidence (the top k are nested), but they also bury it in more text for
a small model: the demonstration measures both rather than assuming either.
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxlab.progress import Tracker
from ctxlab.workshop.catalog import BY_KEY
from ctxlab.workshop.measure import Timer
from ctxlab.workshop.result import Column, DemoResult, Gain, Table
from ctxlab.workshop.session import Session

DEMO = BY_KEY["retrieval_depth"]


@dataclass
class Depth:
    """Everything measured at one k."""

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


def _score(d: Depth, questions: list[Any], answers: list[Any], evidence: dict) -> None:
    """Accuracy and citation quality of `answers`, as the retrieval layer defines them."""
    from ctxlab.memory.scoring import answer_match
    from ctxlab.rag.metrics import citation_precision, citation_recall, mean

    pairs = list(zip(questions, answers, strict=True))
    d.accuracy = mean([float(answer_match(a.text, [q.answer])) for q, a in pairs])
    precisions = [
        p for q, a in pairs if (p := citation_precision(a.citations, evidence[q.id])) is not None
    ]
    d.citation_precision = mean(precisions) if precisions else None
    d.citation_recall = mean([citation_recall(a.citations, evidence[q.id]) for q, a in pairs])
    d.cited_by_model = mean([float(a.cited_by == "model") for a in answers])


def _gold(retriever: Any, key: str) -> Any:
    doc, chunk = key.rsplit("#", 1)
    return retriever.passage(doc, int(chunk))


def steps(session: Session) -> int:
    c = session.cfg.retrieval_depth
    batches = -(-c.answer_questions // session.cfg.engine.max_num_seqs)
    return 1 + batches * len(c.k_values) + (1 if c.gold_row else 0)


def subset(questions: list[Any], n: int, seed: int) -> list[Any]:
    """A seeded sample of `n` questions, kept in the fixture's order."""
    picked = set(random.Random(seed).sample(range(len(questions)), n))
    return [q for i, q in enumerate(questions) if i in picked]


def run(session: Session, tracker: Tracker) -> DemoResult:
    from ctxlab.memory.embed import WordLlamaEmbedder
    from ctxlab.memory.engine_backend import EngineBackend
    from ctxlab.memory.store import open_store
    from ctxlab.plan.cost import HostedPrices
    from ctxlab.rag import (
        CorpusFixture,
        CorpusRetriever,
        answer_questions,
        corpus_fixture,
        evaluate,
    )
    from ctxlab.rag.answer import answer_chat
    from ctxlab.rag.evaluate import evidence_chunks
    from ctxlab.rag.retriever import order_passages
    from ctxlab.workshop.memory_backend import workshop_backend

    c, cost = session.cfg.retrieval_depth, session.cfg.cost
    res = DemoResult(DEMO.number, DEMO.key, DEMO.title, "run", "measured")
    fx = corpus_fixture(c.fixture_seed)
    asked = fx.questions[: c.questions]
    answered = subset(asked, c.answer_questions, c.fixture_seed)
    prices = HostedPrices(input=cost.input_per_mtok, output=cost.output_per_mtok)
    embedder = WordLlamaEmbedder()
    depths: dict[int, Depth] = {}
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
        backend = workshop_backend(session, (batch + 1) * sum(two), batch)
        evidence = {q.id: evidence_chunks(store, q) for q in answered}
        got: dict[int, list[Any]] = {k: [] for k in depths}
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
        for k, d in depths.items():
            _score(d, answered, got[k], evidence)
            n = len(answered)
            d.answer_cpu_s, d.answer_wall_s = spent[k][0] / n, spent[k][1] / n
            d.answer_prompt_tokens, d.answer_reused_tokens = spent[k][2] / n, spent[k][3] / n
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
            gold = Depth(0, 0.0, 0.0, 0.0, 0.0, 0, 0.0)
            _score(gold, answered, gold_answers, evidence)
            tracker.advance()
    session_facts = {"documents": len(fx.docs), "chunks": chunks}
    _tables(session, res, depths, gold, len(asked), len(answered), session_facts)
    _observe(res, depths)
    _explain(session, res, depths, gold, len(asked), len(answered), session_facts)
    from ctxlab.workshop.plots import plot_retrieval_depth

    res.plots.append(
        plot_retrieval_depth(
            [_plot_row(d) for d in depths.values()],
            session.out / "plots" / "6_retrieval_depth.png",
        )
    )
    return res


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _plot_row(d: Depth) -> dict[str, Any]:
    return {
        "k": d.k,
        "recall_pct": 100 * d.recall,
        "accuracy_pct": _pct(d.accuracy),
        "citation_precision_pct": _pct(d.citation_precision),
        "retrieved_tokens": d.retrieved_tokens,
    }


def _observe(res: DemoResult, depths: dict[int, Depth]) -> None:
    lo, hi = depths[min(depths)], depths[max(depths)]
    res.observe("recall_at_k_pct", 100 * lo.recall, 100 * hi.recall, 1)
    res.observe(
        "citation_precision_pct", _pct(lo.citation_precision), _pct(hi.citation_precision), 1
    )
    res.observe("citation_recall_pct", _pct(lo.citation_recall), _pct(hi.citation_recall), 1)
    res.observe("answer_accuracy_pct", _pct(lo.accuracy), _pct(hi.accuracy), 1)
    res.observe("context_tokens_per_question", lo.retrieved_tokens, hi.retrieved_tokens, 1)
    res.observe("cost_per_question_usd", lo.usd_per_1000 / 1000, hi.usd_per_1000 / 1000, 8)


def _tables(
    session: Session,
    res: DemoResult,
    depths: dict[int, Depth],
    gold: Any,
    n_all: int,
    n_answered: int,
    facts: dict[str, int],
) -> None:
    c, money = session.cfg.retrieval_depth, session.cfg.cost.currency
    retrieval = Table(
        "retrieval_depth_retrieval",
        "retrieval",
        f"Demonstration 6: {c.retriever} retrieval at each k over all {n_all} gold questions",
        "measured",
        [
            Column("k"),
            Column("questions"),
            Column("recall@k %", 1),
            Column("MRR@k", 3),
            Column("retrieved tokens per question", 1),
        ],
        note=f"{facts['documents']} document versions cut into {facts['chunks']} chunks, newest "
        "versions searched; recall@k: share of a question's evidence sentences held by a chunk "
        "in the top k; retrieved tokens: what the k passages add to the prompt (chat template "
        "counted, the same prompt without passages subtracted)",
    )
    task = Table(
        "retrieval_depth_task",
        "task",
        f"Demonstration 6: answers at each k on a seeded subset of {n_answered} of the "
        f"{n_all} questions",
        "measured",
        [
            Column("setting"),
            Column("questions answered"),
            Column("accuracy %", 1),
            Column("citation precision %", 1),
            Column("citation recall %", 1),
            Column("citations written by the model %", 1),
        ],
        note=f"the same {n_answered} questions (seed {c.fixture_seed}) at every k, greedy "
        f"answers of at most {c.answer_tokens} tokens, passages in {c.order} order; accuracy: "
        "the gold answer as whole words in the answer; citations the model did not write are "
        "attributed to the passage holding the most answer words; precision over answers "
        "that cite. Not measured on all questions: each answer is a model call per k",
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
    for d in depths.values():
        retrieval.add(d.k, n_all, 100 * d.recall, d.mrr, d.retrieved_tokens)
        task.add(
            f"{c.retriever}@{d.k}",
            n_answered,
            _pct(d.accuracy),
            _pct(d.citation_precision),
            _pct(d.citation_recall),
            _pct(d.cited_by_model),
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
            100 * gold.accuracy,
            _pct(gold.citation_precision),
            100 * gold.citation_recall,
            100 * gold.cited_by_model,
        )
    res.tables += [retrieval, task, costs]


def _explain(
    session: Session,
    res: DemoResult,
    depths: dict[int, Depth],
    gold: Any,
    n_all: int,
    n_answered: int,
    facts: dict[str, int],
) -> None:
    c, f, money = session.cfg.retrieval_depth, res.figures, session.cfg.cost.currency
    lo, hi = depths[min(depths)], depths[max(depths)]
    best = max(depths.values(), key=lambda d: (d.accuracy or 0.0, -d.k))
    for d in depths.values():
        f.say(f"recall_k{d.k}_pct", 100 * d.recall, 1)
        f.say(f"accuracy_k{d.k}_pct", _pct(d.accuracy), 1)
        f.say(f"retrieved_tokens_k{d.k}", d.retrieved_tokens, 1)
    f.say("retrieved_tokens", round(hi.retrieved_tokens))
    res.summary = (
        f"The seeded corpus ({f.say('documents', facts['documents'])} document versions, "
        f"{f.say('chunks', facts['chunks'])} chunks) and its {f.say('questions', n_all)} gold "
        f"questions: {c.retriever} retrieval at k = "
        f"{', '.join(str(k) for k in depths)} over every question; answers on a seeded subset "
        f"of {f.say('answered', n_answered)} questions at every k."
    )
    ceiling = ""
    if gold is not None:
        ceiling = (
            f"; with only the gold passages the model answers "
            f"{f.say('gold_accuracy_pct', 100 * gold.accuracy, 1)}% (its ceiling)"
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
            f"{f.say('accuracy_lo_pct', _pct(lo.accuracy), 1)}% to "
            f"{f.say('accuracy_hi_pct', _pct(hi.accuracy), 1)}%, citation precision from "
            f"{f.say('citation_precision_lo_pct', _pct(lo.citation_precision), 1)}% to "
            f"{f.say('citation_precision_hi_pct', _pct(hi.citation_precision), 1)}%, and a "
            f"question's hosted price from {f.say('usd_1000_lo', lo.usd_per_1000, 4)} to "
            f"{f.say('usd_1000_hi', hi.usd_per_1000, 4)} {money} per 1,000{ceiling}; the best "
            f"accuracy here is at k = {f.say('best_k', best.k)}",
        )
    )
    if best.k != hi.k and best.accuracy is not None and hi.accuracy is not None:
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
                f"on {n_answered} questions "
                "a difference of a few answers is within what another subset could show",
            )
        )
    res.notes.append(
        f"Recall, MRR, tokens and hosted price are over all {n_all} questions; accuracy and "
        f"citations over the seeded subset of {n_answered} (the same questions at every k), "
        "because each answer is a model call per k on 2 CPU cores. A subset this small moves "
        f"in steps of {f.say('step_pct', 100 / n_answered, 1)} points per question."
    )
    res.notes.append(
        "Recall says the evidence reached the prompt, not that the model used it: read "
        "recall@k beside accuracy and citation quality, never alone."
    )
