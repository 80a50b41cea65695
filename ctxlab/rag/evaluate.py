"""`evaluate`: the fixture's 100 gold questions through retrieval, answering and costing.

Four kinds of figure are kept apart because they answer different questions:
retrieval (did the evidence come back: recall@k, MRR, per retriever), task (did the model
answer, and cite, correctly: accuracy by normalized string match, citation precision and
recall), cost (what the context costs: prompt tokens per question, measured prefill time,
hosted-API dollars from `ctxlab.plan.cost`). The "gold passages" task row gives the model
only the evidence chunks: its accuracy is the ceiling the model sets, so the gap between
it and a retriever's row is retrieval's, and the gap below it is the model's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ctxlab import stats
from ctxlab.errors import CtxlabError
from ctxlab.memory.backend import Backend, TextTokenizer, text_tokens
from ctxlab.memory.embed import Embedder, WordLlamaEmbedder
from ctxlab.memory.scoring import answer_match, normalize
from ctxlab.memory.search import RETRIEVERS, check_retriever
from ctxlab.memory.store import Store, open_store
from ctxlab.plan.cost import HostedPrices
from ctxlab.plan.rate_card import RateCard, price
from ctxlab.progress import progress
from ctxlab.rag.answer import Answer, answer_chat, answer_questions, check_metadata
from ctxlab.rag.chunking import check_sizes
from ctxlab.rag.corpus import CorpusFixture, GoldQuestion, corpus_fixture, read_questions
from ctxlab.rag.documents import chunks_of, ingest_all
from ctxlab.rag.metrics import (
    citation_precision,
    citation_recall,
    mean,
    recall_at_k,
    reciprocal_rank,
)
from ctxlab.rag.readers import collect
from ctxlab.rag.report import (
    CostRow,
    EvalReport,
    RecallComparison,
    RetrievalRow,
    TaskRow,
    verdict,
)
from ctxlab.rag.retriever import DEFAULT_RETRIEVER, CorpusRetriever, Passage, order_passages

# Illustrative prices (USD per million tokens) for a small hosted model, not a vendor quote;
# pass your own HostedPrices (CLI: --price-input, --price-output).
EXAMPLE_PRICES = HostedPrices(input=0.10, output=0.40)
BATCH = 8


def evidence_chunks(store: Store, question: GoldQuestion) -> list[set[str]]:
    """For each evidence sentence, the keys of the newest-version chunks that contain it."""
    chunks = chunks_of(store, question.doc_id)
    if not chunks:
        raise CtxlabError(f"question {question.id}: the corpus has no document {question.doc_id}.")
    out = []
    for sentence in question.evidence:
        want = normalize(sentence)
        keys = {f"{question.doc_id}#{c.index}" for c in chunks if want in normalize(c.text)}
        if not keys:
            raise CtxlabError(
                f"question {question.id}: no chunk of {question.doc_id} holds its evidence "
                f"{sentence!r} (chunks too small for the sentence?)."
            )
        out.append(keys)
    return out


def ingest_fixture(
    store: Store,
    tokenizer: TextTokenizer,
    embedder: Embedder | None,
    seed: int = 0,
    chunk_tokens: int = 64,
    overlap_tokens: int = 8,
    tokenizer_name: str = "model",
    corpus: CorpusFixture | None = None,
) -> CorpusFixture:
    """Ingest `corpus` (default: the seeded fixture) and return it."""
    fixture = corpus if corpus is not None else corpus_fixture(seed)
    ingest_all(
        store, fixture.docs, tokenizer, embedder, chunk_tokens, overlap_tokens, tokenizer_name
    )
    return fixture


def named_corpus(paths: Sequence[Path], questions: Path) -> CorpusFixture:
    """A user's corpus (files or folders) and its gold questions (JSON lines as written by
    `ctxlab rag fixture`: id, question, answer, doc_id, evidence)."""
    return CorpusFixture(collect(list(paths)), read_questions(questions), seed=-1)


@dataclass(frozen=True)
class EvalOptions:
    """What `evaluate` measures; every field has the CLI's default."""

    ks: tuple[int, ...] = (1, 2, 4, 8)
    retrievers: tuple[str, ...] = RETRIEVERS
    answer_k: int = 2
    answer_retrievers: tuple[str, ...] = (DEFAULT_RETRIEVER,)
    gold_row: bool = True  # answer from the gold passages alone: the model's ceiling
    closed_book: bool = False  # answer with no passages: what the model knows by itself
    order: str = "relevance"  # or "edges" (against lost-in-the-middle)
    answer_tokens: int = 16
    cost_samples: int = 4  # questions whose prefill is timed, per k
    prices: HostedPrices | RateCard = EXAMPLE_PRICES
    seed: int = 0
    chunk_tokens: int = 64
    overlap_tokens: int = 8
    limit: int | None = None  # only the first n questions
    answers: bool = True  # False: retrieval and token counts only, no model
    metadata: str = "auto"  # passage dates in the prompt: auto (version questions), always, never

    def check(self) -> EvalOptions:
        if not self.ks or min(self.ks) < 1:
            raise CtxlabError("--k needs whole numbers of at least 1, e.g. 1,2,4,8.")
        for r in (*self.retrievers, *self.answer_retrievers):
            check_retriever(r)
        if not self.retrievers:
            raise CtxlabError("--retriever needs at least one of bm25, dense, hybrid.")
        if self.answer_k < 1:
            raise CtxlabError(f"--answer-k must be at least 1, got {self.answer_k}.")
        if self.limit is not None and self.limit < 1:
            raise CtxlabError(f"--limit must be at least 1, got {self.limit}.")
        order_passages([], self.order)
        check_metadata(self.metadata)
        check_sizes(self.chunk_tokens, self.overlap_tokens)
        return replace(self, ks=tuple(sorted(set(self.ks))))


def evaluate(
    backend: Backend,
    db: str | Path | Store | None = None,
    options: EvalOptions | None = None,
    embedder: Embedder | None = None,
    show_progress: bool = True,
    corpus: CorpusFixture | None = None,
    **overrides: Any,
) -> EvalReport:
    """Ingest the seeded fixture (or `corpus`, see `named_corpus`) into `db` (a temporary
    store if None) and measure it.

    `options` (or keyword overrides of its fields, e.g. `ks=(1, 4)`) say what to measure.
    `backend` must also split text into tokens (chunks are cut in its tokens).
    """
    opts = replace(options or EvalOptions(), **overrides).check()
    if not isinstance(backend, TextTokenizer):
        raise CtxlabError("the backend cannot split text into tokens; give it a tokenizer.")
    emb = embedder if embedder is not None else WordLlamaEmbedder()
    if isinstance(db, Store):
        return _evaluate(db, backend, emb, opts, show_progress, corpus)
    with (
        tempfile.TemporaryDirectory(prefix="ctxlab-rag-") as tmp,
        open_store(Path(db) if db is not None else Path(tmp) / "rag.db") as store,
    ):
        return _evaluate(store, backend, emb, opts, show_progress, corpus)


def _evaluate(
    store: Store,
    backend: Backend,
    emb: Embedder,
    o: EvalOptions,
    show_progress: bool,
    corpus: CorpusFixture | None,
) -> EvalReport:
    label = str(getattr(backend, "model_label", backend.name))
    with progress("ingesting the corpus", enabled=show_progress):
        tokenizer: Any = backend
        fixture = ingest_fixture(
            store, tokenizer, emb, o.seed, o.chunk_tokens, o.overlap_tokens, label, corpus
        )
    run = _Run(store, backend, CorpusRetriever(store, emb), o, show_progress, fixture, label)
    run.retrieval()
    run.cost(run.task())
    run.report.per_question = list(run.per_q.values())
    run.report.verdict = verdict(run.report, o.answer_k, run.main_retriever)
    return run.report


class _Run:
    """One evaluation's shared state; each table is one method."""

    def __init__(
        self,
        store: Store,
        backend: Backend,
        retriever: CorpusRetriever,
        o: EvalOptions,
        show_progress: bool,
        fixture: CorpusFixture,
        label: str,
    ) -> None:
        self.backend, self.retriever, self.o, self.show = backend, retriever, o, show_progress
        self.questions = fixture.questions[: o.limit] if o.limit else fixture.questions
        self.evidence = {q.id: evidence_chunks(store, q) for q in self.questions}
        self.main_retriever = o.answer_retrievers[0] if o.answer_retrievers else o.retrievers[0]
        settings: dict[str, object] = dict(asdict(o))
        settings.update(
            questions=len(self.questions),
            documents=len(fixture.docs),
            chunks=retriever.chunk_count(),
            backend=backend.name,
            model=label,
            db=str(store.path),
        )
        self.report = EvalReport(settings=settings)
        self.recalls: dict[tuple[str, int], list[float]] = {}
        self.per_q: dict[str, dict[str, object]] = {
            q.id: {"id": q.id, "kind": q.kind, "question": q.question, "answer": q.answer}
            for q in self.questions
        }

    def retrieval(self) -> None:
        o, qs, ev = self.o, self.questions, self.evidence
        depth = max(o.ks)
        with progress("retrieval", len(o.retrievers) * len(qs), enabled=self.show) as bar:
            for name in o.retrievers:
                ranked = {}
                for q in qs:
                    ranked[q.id] = [p.key for p in self.retriever.search(q.question, depth, name)]
                    bar.advance()
                for k in o.ks:
                    scores = [recall_at_k(ranked[q.id], ev[q.id], k) for q in qs]
                    self.recalls[name, k] = scores
                    mrr = mean([reciprocal_rank(ranked[q.id][:k], ev[q.id]) for q in qs])
                    ci = stats.mean_interval(scores, seed=o.seed)
                    self.report.retrieval.append(
                        RetrievalRow(name, k, ci.value, mrr, len(qs), ci.low, ci.high)
                    )
                for q in qs:
                    self.per_q[q.id][f"ranked {name}"] = ranked[q.id]
        base = self.main_retriever if self.main_retriever in o.retrievers else o.retrievers[0]
        for name in o.retrievers:
            for k in o.ks if name != base else ():
                p = stats.paired(self.recalls[base, k], self.recalls[name, k], seed=o.seed)
                kind = stats.verdict(p.change, "up")
                word = {"held": "better", "failed": "worse"}.get(kind, "within noise")
                self.report.comparisons.append(
                    RecallComparison(
                        base, name, k, p.change.value, p.change.low, p.change.high, len(qs), word
                    )
                )

    def settings(self) -> list[tuple[str, list[list[Passage]]]]:
        """(name, passages per question) for every answer setting."""
        o, qs = self.o, self.questions
        out: list[tuple[str, list[list[Passage]]]] = []
        for name in o.answer_retrievers:
            found = [self.retriever.search(q.question, o.answer_k, name) for q in qs]
            out.append((f"{name}@{o.answer_k}", [order_passages(p, o.order) for p in found]))
        if o.gold_row:
            gold = [
                [_gold_passage(self.retriever, min(item)) for item in self.evidence[q.id]]
                for q in qs
            ]
            out.append(("gold passages", gold))
        if o.closed_book:
            out.append(("no passages", [[] for _ in qs]))
        return out

    def task(self) -> float:
        """Answer every question in every setting; returns the mean answer length in tokens."""
        o, qs = self.o, self.questions
        if not o.answers:
            return float(o.answer_tokens)
        settings = self.settings()
        lengths: list[int] = []
        with progress("answering", len(settings) * len(qs), enabled=self.show) as bar:
            for setting, passages in settings:
                got: list[Answer] = []
                for start in range(0, len(qs), BATCH):
                    part = qs[start : start + BATCH]
                    got += answer_questions(
                        self.backend,
                        [q.question for q in part],
                        passages[start : start + BATCH],
                        o.answer_tokens,
                        o.metadata,
                    )
                    bar.advance(len(part))
                self.report.task.append(_task_row(setting, qs, got, self.evidence))
                for q, a in zip(qs, got, strict=True):
                    self.per_q[q.id][f"answer {setting}"] = a.text
                    self.per_q[q.id][f"citations {setting}"] = a.citations
                lengths += [text_tokens(self.backend, a.text) for a in got]
        return mean(lengths)

    def cost(self, output_tokens: float) -> None:
        o, name = self.o, self.main_retriever
        with progress("cost", len(o.ks), enabled=self.show) as bar:
            warmed = False
            for k in o.ks:
                chats = [
                    answer_chat(
                        q.question,
                        order_passages(self.retriever.search(q.question, k, name), o.order),
                        o.metadata,
                    )
                    for q in self.questions
                ]
                tokens = [self.backend.count_tokens(c) for c in chats]
                times: list[float] = []
                if o.answers and o.cost_samples > 0:
                    if not warmed:
                        self.backend.measure_prefill(chats[0])  # pays one-time setup
                        warmed = True
                    for chat in chats[: o.cost_samples]:
                        t = self.backend.measure_prefill(chat)
                        if t is not None:
                            times.append(t)
                avg = mean(tokens)
                dollars = price(o.prices, round(avg), round(output_tokens)).total * 1000
                self.report.cost.append(
                    CostRow(name, k, avg, mean(times) if times else None, len(times), dollars)
                )
                bar.advance()


def _gold_passage(retriever: CorpusRetriever, key: str) -> Passage:
    doc, chunk = key.rsplit("#", 1)
    return retriever.passage(doc, int(chunk))


def _task_row(
    setting: str,
    questions: Sequence[GoldQuestion],
    got: Sequence[Answer],
    evidence: dict[str, list[set[str]]],
) -> TaskRow:
    correct = [answer_match(a.text, [q.answer]) for q, a in zip(questions, got, strict=True)]
    precisions = [
        p
        for q, a in zip(questions, got, strict=True)
        if (p := citation_precision(a.citations, evidence[q.id])) is not None
    ]
    kinds: dict[str, list[bool]] = {}
    for q, ok in zip(questions, correct, strict=True):
        kinds.setdefault(q.kind, []).append(ok)
    recalls = [
        citation_recall(a.citations, evidence[q.id]) for q, a in zip(questions, got, strict=True)
    ]
    acc, cr = stats.proportion(correct), stats.mean_interval(recalls)
    cp = stats.mean_interval(precisions) if precisions else None
    return TaskRow(
        setting=setting,
        questions=len(questions),
        accuracy=mean([float(c) for c in correct]),
        citation_precision=mean(precisions) if precisions else None,
        citation_recall=mean(recalls),
        cited_by_model=mean([float(a.cited_by == "model") for a in got]),
        accuracy_by_kind={k: mean([float(x) for x in v]) for k, v in sorted(kinds.items())},
        correct=sum(correct),
        accuracy_low=acc.low,
        accuracy_high=acc.high,
        citing_answers=len(precisions),
        citation_precision_low=cp.low if cp else None,
        citation_precision_high=cp.high if cp else None,
        citation_recall_low=cr.low,
        citation_recall_high=cr.high,
    )
