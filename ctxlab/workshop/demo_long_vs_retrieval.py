"""Demonstration 11: long context against retrieval, at equal cost.

Demonstration 6 measures BM25 at each k; this one puts the corpus itself in the prompt beside
it, on the same questions. The corpus is a slice of demonstration 6's seeded fixture (made-up
organisations, `ctxlab.rag.corpus_fixture`) that fits the model's window: whole
organisations (the newest version of each of their documents), in the fixture's order,
while the prompt stays within `context_tokens`. Its chunks are the passages BM25 searches,
rendered the same way, so the rows differ only in which passages the prompt holds and how
many: bm25@k (the k best chunks of the slice), or every chunk of it.

Every answer is one request sent alone (its TTFT is its own prefill, not a batch's queue),
through `session.requests.generator()`: the local engine, or the run's server. Rows:

- bm25@k at each k: the question's own prompt (a per-row cache salt: only the system prompt
  is shared between a row's questions);
- whole corpus, cold: a cache salt nothing was cached under, so nothing is reused
  (`cold_questions` of the answered questions; their answers are checked against the warm
  row's);
- whole corpus, warm: one salt for the row, the corpus written to the prefix cache once (the
  cold row's first request, question 1 sent under the warm row's salt before anything is
  cached there; its CPU seconds spread over the row's answers) and read by every answer.

Accuracy, citations and evidence recall are paired over the same questions (`ctxlab.stats`:
paired bootstrap, exact McNemar), with n and Wilson intervals; TTFT is the engine's (or the
client's clock through a server), CPU seconds this process's around each request (the
engine's work on the local backend; through a server they would be the client's, so they
are not reported); the hosted price of each answer comes from the workshop's prices
(`[cost]`, or its `rate_card`), the warm row's shared prefix priced as one cache write and a
cache read per answer; a run whose `[cost]` names no card is priced under the shipped dated
card too (`ctxlab/data/rate_card.toml`), and the CPU seconds at `cpu_hourly` give the
self-hosted figure. A verdict column says, for each retrieval row, whether the whole corpus
answers better, worse or within noise, which of the two costs less, and which starts its
answer sooner; "long context wins" where it answers better, or within noise for less.

The file is in three parts: `measure` returns frozen records (an `Answer` per question in a
`Row` per setting; a row's name is rendered by `label`), `verdicts` records the
observations and judges the whole corpus against each retrieval row (`Comparison`s: the one
place it judges), and the tables, prose and plot are rendered from the records and those
comparisons. Through a server that refuses a request (a window shorter than the
whole-corpus prompt) it is not measurable, with the server's sentence.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, NamedTuple, Protocol

from pydantic import Field, model_validator

from ctxlab import stats
from ctxlab.progress import Tracker
from ctxlab.stats import Interval
from ctxlab.workshop.config import CommonConfig, Pos, Section, Seed, fits
from ctxlab.workshop.demonstration import Demonstration, Metric, Plot, ServerMode
from ctxlab.workshop.measure import Timer
from ctxlab.workshop.result import Column, DemoResult, Figures, Gain, Table
from ctxlab.workshop.session import Session

if TYPE_CHECKING:
    from ctxlab.engine import SamplingParams
    from ctxlab.memory.backend import Chat
    from ctxlab.memory.store import Store
    from ctxlab.plan.rate_card import RateCard
    from ctxlab.rag.corpus import CorpusFixture, GoldQuestion
    from ctxlab.rag.retriever import CorpusRetriever, Passage
    from ctxlab.workshop.request_backend import Generator

Kind = Literal["retrieval", "cold", "warm"]
QUESTION_TOKENS = 64  # room kept for a question and the chat's closing tokens


# -- records ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    """One question answered by one setting: what came back and what it cost."""

    question_id: str  # the gold question's id (the fixture's)
    text: str  # the model's answer
    correct: bool
    evidence: float  # share of the question's evidence sentences in the prompt
    precision: float | None  # citation precision (None: the answer cites nothing)
    citation_recall: float
    context_tokens: int  # what the passages add to the prompt
    prompt_tokens: int
    reused_tokens: int
    output_tokens: int
    ttft_ms: float
    cpu_s: float | None  # this process around the request (None through a server)
    usd: float  # hosted price under the workshop's prices
    usd_dated: float | None  # under the shipped dated card (None: not priced under it)


@dataclass(frozen=True)
class Row:
    """One setting's answers, in the order of the questions it answered."""

    kind: Kind
    k: int | None  # retrieval: BM25's k
    answers: tuple[Answer, ...]

    @property
    def questions(self) -> tuple[str, ...]:
        return tuple(a.question_id for a in self.answers)

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(a.text for a in self.answers)

    @property
    def correct(self) -> tuple[bool, ...]:
        return tuple(a.correct for a in self.answers)

    @property
    def evidence(self) -> tuple[float, ...]:
        return tuple(a.evidence for a in self.answers)

    @property
    def precisions(self) -> tuple[float, ...]:
        """Per answer that cites."""
        return tuple(a.precision for a in self.answers if a.precision is not None)

    @property
    def citation_recalls(self) -> tuple[float, ...]:
        return tuple(a.citation_recall for a in self.answers)

    @property
    def context_tokens(self) -> tuple[int, ...]:
        return tuple(a.context_tokens for a in self.answers)

    @property
    def prompt_tokens(self) -> tuple[int, ...]:
        return tuple(a.prompt_tokens for a in self.answers)

    @property
    def reused_tokens(self) -> tuple[int, ...]:
        return tuple(a.reused_tokens for a in self.answers)

    @property
    def output_tokens(self) -> tuple[int, ...]:
        return tuple(a.output_tokens for a in self.answers)

    @property
    def ttft_ms(self) -> tuple[float, ...]:
        return tuple(a.ttft_ms for a in self.answers)

    @property
    def cpu_s(self) -> tuple[float, ...]:
        """Per answer, where measured (none through a server)."""
        return tuple(a.cpu_s for a in self.answers if a.cpu_s is not None)

    @property
    def usd(self) -> tuple[float, ...]:
        return tuple(a.usd for a in self.answers)

    @property
    def usd_dated(self) -> tuple[float, ...]:
        return tuple(a.usd_dated for a in self.answers if a.usd_dated is not None)

    def accuracy(self) -> Interval:
        return stats.proportion(self.correct)

    def mean(self, values: Sequence[float] | Sequence[int]) -> float | None:
        return sum(values) / len(values) if values else None


def label(row: Row) -> str:
    """A row's name in the tables and the prose."""
    if row.kind == "retrieval":
        return f"bm25@{row.k}"
    return f"whole corpus, {row.kind}"


@dataclass(frozen=True)
class Slice:
    """The part of the fixture the whole-corpus prompt holds."""

    organisations: int
    of_organisations: int
    documents: int
    chunks: int
    corpus_tokens: int  # what every chunk adds to a question's prompt
    shared_prefix_tokens: int  # tokens every whole-corpus prompt shares (the cached prefix)
    questions: int  # gold questions about the slice


@dataclass(frozen=True)
class Write:
    """The warm row's one cache write: the corpus prefilled once under the row's salt (the
    cold row's first answer: question 1, nothing cached under that salt yet)."""

    ttft_ms: float
    cpu_s: float | None


@dataclass(frozen=True)
class Measured:
    rows: tuple[Row, ...]  # each k, then the whole corpus cold and warm
    slice: Slice
    write: Write
    slot_bytes: int
    dated: bool  # also priced under the shipped dated card (a run whose [cost] names none)
    cpu_hourly: float  # self-hosted: what an hour of this machine's CPU costs
    through_server: bool


# -- the slice ------------------------------------------------------------------------------
def organisations(fx: CorpusFixture) -> list[list[str]]:
    """Doc ids per organisation (its profile, then its news item), in the fixture's order."""
    order: list[str] = []
    for d in fx.docs:
        if d.doc_id.startswith("profile-") and d.doc_id not in order:
            order.append(d.doc_id)
    ids = {d.doc_id for d in fx.docs}
    out = []
    for profile in order:
        news = f"news-{profile.removeprefix('profile-')}-2021"
        out.append([profile, *([news] if news in ids else [])])
    return out


def corpus_passages(retriever: CorpusRetriever, store: Store, doc_ids: list[str]) -> list[Passage]:
    """Every chunk of the newest version of each document, in order."""
    from ctxlab.rag.documents import chunks_of

    return [retriever.passage(d, c.index) for d in doc_ids for c in chunks_of(store, d)]


def choose_slice(
    fx: CorpusFixture, counter: Tokens, c: LongContextSection
) -> tuple[list[str], int]:
    """The doc ids of the most whole organisations whose chunks fit `context_tokens` in a
    prompt (answer_chat with every chunk and no question), and how many organisations."""
    from ctxlab.memory.store import open_store
    from ctxlab.rag.answer import answer_chat
    from ctxlab.rag.evaluate import ingest_fixture
    from ctxlab.rag.retriever import CorpusRetriever

    groups = organisations(fx)
    chosen: list[str] = []
    taken = 0
    with (
        tempfile.TemporaryDirectory(prefix="ctxlab-workshop-long-") as tmp,
        open_store(Path(tmp) / "all.db") as store,
    ):
        ingest_fixture(store, counter, None, corpus=fx)
        retriever = CorpusRetriever(store, None)
        empty = counter.count_tokens(answer_chat("", [], metadata=c.metadata))
        for group in groups:
            passages = corpus_passages(retriever, store, chosen + group)
            chat = answer_chat("", passages, metadata=c.metadata)
            if counter.count_tokens(chat) - empty > c.context_tokens:
                break
            chosen += group
            taken += 1
    if not chosen:
        from ctxlab.errors import CtxlabError

        raise CtxlabError(
            f"long_vs_retrieval.context_tokens {c.context_tokens} is too small to hold one "
            "organisation of the corpus; raise it (one takes about 350 tokens)."
        )
    return chosen, taken


# -- measuring ------------------------------------------------------------------------------
class Tokens(Protocol):
    """What the slice and the prompts need of a tokenizer: a chat's exact prompt tokens
    and text spans for chunking (`EngineBackend` over the session's model answers both
    without a model call)."""

    name: str

    def count_tokens(self, chat: Chat) -> int: ...
    def spans(self, text: str) -> list[tuple[int, int]]: ...


def tokens(session: Session) -> Tokens:
    from ctxlab.memory.engine_backend import EngineBackend

    return EngineBackend(session.loaded, session.cfg.model.max_model_len)


def steps(session: Session) -> int:
    c = DEMO.config(session.cfg)
    return 2 + c.answer_questions


class Answered(NamedTuple):
    """One request sent alone, as it came back."""

    text: str
    prompt_tokens: int
    reused_tokens: int
    output_tokens: int
    ttft_ms: float
    cpu_s: float


class Unanswered(Exception):
    """A server refused one of this demonstration's requests (its sentence says why): the
    demonstration is not measurable through it, and the run goes on."""


def _ask(gen: Generator, chat: list[dict[str, str]], max_tokens: int, salt: str) -> Answered:
    from ctxlab.errors import CtxlabError

    with Timer() as t:
        try:
            (out,) = gen.generate([chat], _params(max_tokens), cache_salt=salt)
        except CtxlabError as exc:  # a server's refusal (the local engine raises none here)
            raise Unanswered(str(exc).rstrip(".")) from None
    m = out.metrics
    return Answered(
        out.text.strip(),
        len(out.prompt_token_ids),
        m.reused_tokens,
        len(out.token_ids),
        m.ttft * 1e3,
        t.cpu_s,
    )


def _answer(
    q: GoldQuestion,
    passages: list[Passage],
    evidence: list[set[str]],
    got: Answered,
    bare: int,
    server: bool,
) -> Answer:
    """One answer scored: its match, the evidence its prompt held, its citations (priced
    later, once the row is complete)."""
    from ctxlab.memory.scoring import answer_match
    from ctxlab.rag.answer import cite
    from ctxlab.rag.metrics import citation_precision, citation_recall, recall_at_k

    text, prompt, reused, output, ttft, cpu = got
    cited, _ = cite(text, q.question, passages)
    keys = [p.key for p in passages]
    return Answer(
        q.id,
        text,
        answer_match(text, [q.answer]),
        recall_at_k(keys, evidence, len(keys)),
        citation_precision(cited, evidence),
        citation_recall(cited, evidence),
        prompt - bare,
        prompt,
        reused,
        output,
        ttft,
        None if server else cpu,
        0.0,
        None,
    )


def _shared_prefix(ids: list[list[int]]) -> int:
    first, n = ids[0], min(len(x) for x in ids)
    for i in range(n):
        if any(x[i] != first[i] for x in ids[1:]):
            return i
    return n


def measure(session: Session, tracker: Tracker) -> Measured:
    from ctxlab.memory.store import open_store
    from ctxlab.rag import corpus_fixture
    from ctxlab.rag.answer import answer_chat
    from ctxlab.rag.corpus import CorpusFixture
    from ctxlab.rag.evaluate import evidence_chunks, ingest_fixture
    from ctxlab.rag.retriever import CorpusRetriever, order_passages
    from ctxlab.workshop.demo_retrieval_depth import subset

    c = DEMO.config(session.cfg)
    card = session.cfg.cost.card()
    counter = tokens(session)
    tok = session.loaded.tokenizer
    fx = corpus_fixture(c.fixture_seed, c.fixture_organisations)
    doc_ids, taken = choose_slice(fx, counter, c)
    kept = set(doc_ids)
    part = CorpusFixture([d for d in fx.docs if d.doc_id in kept], [], fx.seed)
    about = [q for q in fx.questions if q.doc_id in kept]
    answered = subset(about, min(c.answer_questions, len(about)), c.fixture_seed)
    tracker.advance()
    gen = session.requests.generator()
    server = bool(session.requests.label)
    tag = secrets.token_hex(4)  # a server outlives runs: this run's salts are its own
    found_by_k: list[list[Answer]] = [[] for _ in c.k_values]
    cold: list[Answer] = []
    warm: list[Answer] = []
    with (
        tempfile.TemporaryDirectory(prefix="ctxlab-workshop-long-") as tmp,
        open_store(Path(tmp) / "slice.db") as store,
    ):
        ingest_fixture(store, counter, None, corpus=part)
        retriever = CorpusRetriever(store, None)
        whole = corpus_passages(retriever, store, doc_ids)
        chats = [answer_chat(q.question, whole, c.metadata) for q in answered]
        ids = [tok.apply_chat(list(ch), add_generation_prompt=True) for ch in chats]
        shared = _shared_prefix(ids) if len(ids) > 1 else 0
        corpus_tokens = counter.count_tokens(answer_chat("", whole, c.metadata))
        corpus_tokens -= counter.count_tokens(answer_chat("", [], c.metadata))
        # the first cold answer is also the warm row's one cache write: nothing is cached
        # under the warm row's salt yet, and its prompt is the corpus and question 1
        evidence = [evidence_chunks(store, q) for q in answered]
        bare = [counter.count_tokens(answer_chat(q.question, [], c.metadata)) for q in answered]
        got = _ask(gen, chats[0], c.answer_tokens, f"{tag}-warm")
        cold.append(_answer(answered[0], whole, evidence[0], got, bare[0], server))
        write = Write(got.ttft_ms, None if server else got.cpu_s)
        tracker.advance()
        for i, q in enumerate(answered):
            for k, into in zip(c.k_values, found_by_k, strict=True):
                found = order_passages(retriever.search(q.question, k, "bm25"), c.order)
                chat = answer_chat(q.question, found, c.metadata)
                got = _ask(gen, chat, c.answer_tokens, f"{tag}-bm25@{k}")
                into.append(_answer(q, found, evidence[i], got, bare[i], server))
            got = _ask(gen, chats[i], c.answer_tokens, f"{tag}-warm")
            warm.append(_answer(q, whole, evidence[i], got, bare[i], server))
            if 0 < i < c.cold_questions:
                got = _ask(gen, chats[i], c.answer_tokens, f"{tag}-cold-{i}")
                cold.append(_answer(q, whole, evidence[i], got, bare[i], server))
            tracker.advance()
    dated = _dated_card(session, card)
    unpriced = [
        *(Row("retrieval", k, tuple(a)) for k, a in zip(c.k_values, found_by_k, strict=True)),
        Row("cold", None, tuple(cold)),
        Row("warm", None, tuple(warm)),
    ]
    rows = tuple(_price(row, card, dated, shared) for row in unpriced)
    facts = Slice(
        taken,
        len(organisations(fx)),
        len(doc_ids),
        len(whole),
        corpus_tokens,
        shared,
        len(about),
    )
    return Measured(
        rows,
        facts,
        write,
        session.requests.slot_bytes(gen),
        dated is not None,
        session.cfg.cost.self_hosted_prices().cpu_hourly,
        server,
    )


def _price(row: Row, card: RateCard, dated: RateCard | None, shared: int) -> Row:
    """`row` with each answer's hosted price under `card` (and under `dated`, if any)."""
    usd = priced(row, card, shared)
    old = priced(row, dated, shared) if dated is not None else [None] * len(usd)
    answers = tuple(
        replace(a, usd=u, usd_dated=d) for a, u, d in zip(row.answers, usd, old, strict=True)
    )
    return replace(row, answers=answers)


def priced(row: Row, card: RateCard, shared: int) -> list[float]:
    """The hosted price of each of `row`'s answers under `card`, from its exact prompt and
    output tokens: all uncached input, except the warm row's `shared` prefix tokens, read
    from the provider's cache, whose one write is spread over the row's answers."""
    pairs = list(zip(row.prompt_tokens, row.output_tokens, strict=True))
    if row.kind != "warm":
        return [card.cost(p, o).total for p, o in pairs]
    write = card.cost(0, 0, cache_write_tokens=shared).total / len(pairs)
    return [card.cost(p - shared, o, 0, shared).total + write for p, o in pairs]


def _dated_card(session: Session, card: RateCard) -> RateCard | None:
    """The shipped dated card, priced beside a run whose `[cost]` names no card (same
    currency only: nothing is converted)."""
    from ctxlab.plan.rate_card import DEFAULT, load_rate_card

    if session.cfg.cost.rate_card:
        return None
    dated = load_rate_card(DEFAULT)
    return dated if dated.currency == card.currency else None


def _params(max_tokens: int) -> SamplingParams:
    from ctxlab.engine import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def _card_label(card: RateCard) -> str:
    if card.source == "given":
        return "the `[cost]` table's prices (no rate card named: undated)"
    return f"`{card.name}` ({card.tier}, {card.region}, prices of {card.date})"


# -- judging and rendering ------------------------------------------------------------------
PAIRED = "paired bootstrap over the same questions"


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _on(row: Row, ref: Row) -> list[bool]:
    """`ref`'s outcomes on the questions `row` answered, in `row`'s order."""
    at = dict(zip(ref.questions, ref.correct, strict=True))
    return [at[q] for q in row.questions]


def against(row: Row, ref: Row) -> stats.Paired:
    """`ref` minus `row` over the questions `row` answered (points, 0/1 outcomes)."""
    return stats.paired([float(x) for x in row.correct], [float(x) for x in _on(row, ref)])


def points(p: stats.Paired) -> Interval:
    c = p.change
    return Interval(100 * c.value, 100 * c.low, 100 * c.high, c.n, c.method)


def _per_1000(row: Row) -> float | None:
    m = row.mean(row.usd)
    return None if m is None else 1000 * m


Better = Literal["whole corpus", "retrieval", "neither"]


@dataclass(frozen=True)
class Comparison:
    """The whole corpus (warm) judged against one retrieval row."""

    row: int  # the retrieval row's index in Measured.rows
    better: Better  # which answers better beyond noise (the paired interval excludes zero)
    warm_cheaper: bool  # the whole corpus (warm) costs less per answer
    sooner: Literal["whole corpus", "retrieval"] | None  # beyond noise; None: neither
    wins: bool  # long context wins: better answers, or answers within noise for less


@dataclass(frozen=True)
class Judged:
    """What `verdicts` judged, for the tables and the prose."""

    comparisons: tuple[Comparison, ...]  # one per retrieval row, in table order
    best: int  # index of the retrieval row that answered most (the smaller k on a tie)

    def of(self, row: int) -> Comparison | None:
        return next((c for c in self.comparisons if c.row == row), None)


def better(row: Row, warm: Row) -> Better:
    """Which answers better beyond noise, over the questions `row` answered."""
    ci = points(against(row, warm))
    return "whole corpus" if ci.low > 0 else "retrieval" if ci.high < 0 else "neither"


def _warm_cheaper(row: Row, warm: Row) -> bool:
    return (warm.mean(warm.usd) or 0.0) < (row.mean(row.usd) or 0.0)


def compare(i: int, row: Row, warm: Row) -> Comparison:
    """Whole corpus (warm) against retrieval row `i`: answers, price per answer, and which
    starts its answer sooner (the paired interval of the median TTFT difference)."""
    side = better(row, warm)
    cheaper = _warm_cheaper(row, warm)
    sooner: Literal["whole corpus", "retrieval"] | None = None
    if warm.ttft_ms and row.ttft_ms:
        # paired over the questions both answered (every retrieval row answers them all)
        change = stats.median_difference(row.ttft_ms, warm.ttft_ms, paired_items=True)
        sooner = "whole corpus" if change.high < 0 else "retrieval" if change.low > 0 else None
    wins = side == "whole corpus" or (side == "neither" and cheaper)
    return Comparison(i, side, cheaper, sooner, wins)


def said(c: Comparison, row: Row) -> str:
    """A comparison in words, for the cost table's last column."""
    name = label(row)
    answers = {
        "whole corpus": "whole corpus answers better beyond noise",
        "retrieval": f"{name} answers better beyond noise",
        "neither": "answers within noise",
    }[c.better]
    text = f"{answers}; cheaper: {'whole corpus (warm)' if c.warm_cheaper else name}"
    if c.sooner is not None:
        text += f"; sooner: {'whole corpus (warm)' if c.sooner == 'whole corpus' else name}"
    return ("long context wins: " if c.wins else "") + text


def verdicts(res: DemoResult, m: Measured) -> Judged:
    """The observations the run's predictions are judged on, and the whole corpus (warm)
    against each retrieval row: the one place this demonstration judges."""
    observe(res, m)
    warm = _row(m, "warm")
    retrieval = [(i, r) for i, r in enumerate(m.rows) if r.kind == "retrieval"]
    best = max(retrieval, key=lambda ir: (sum(ir[1].correct), -(ir[1].k or 0)))[0]
    return Judged(tuple(compare(i, r, warm) for i, r in retrieval), best)


def observe(res: DemoResult, m: Measured) -> None:
    """The catalogue's metrics, baseline BM25 at the largest k unless the metric says."""
    retrieval = [r for r in m.rows if r.kind == "retrieval"]
    hi, cold, warm = retrieval[-1], _row(m, "cold"), _row(m, "warm")
    n = len(warm.correct)
    res.observe(
        "answer_accuracy_pct",
        100 * hi.accuracy().value,
        100 * warm.accuracy().value,
        1,
        change=points(against(hi, warm)),
        test=f"{PAIRED}, {n} questions",
    )
    res.observe(
        "evidence_recall_pct",
        _pct(hi.mean(hi.evidence)),
        _pct(warm.mean(warm.evidence)),
        1,
        change=points(stats.paired(hi.evidence, warm.evidence)),
        test=f"{PAIRED}, {n} questions",
    )
    res.observe(
        "citation_precision_pct",
        _pct(hi.mean(hi.precisions)),
        _pct(warm.mean(warm.precisions)),
        1,
    )
    res.observe(
        "context_tokens_per_question",
        hi.mean(hi.context_tokens),
        warm.mean(warm.context_tokens),
        1,
    )
    not_cold = not_isolated(cold, res.figures)
    if not_cold is not None:
        res.observe("ttft_cold_ms", None, None, 1, why_missing=not_cold)
        res.observe("ttft_warm_ms", None, None, 1, why_missing=not_cold)
    else:
        res.observe_latency("ttft_cold_ms", hi.ttft_ms, cold.ttft_ms, 1, items="requests")
        res.observe_latency("ttft_warm_ms", cold.ttft_ms, warm.ttft_ms, 1, items="requests")
    res.observe_latency(
        "ttft_warm_vs_retrieval_ms", hi.ttft_ms, warm.ttft_ms, 1, items="questions", paired=True
    )
    why = "through a server this process's CPU seconds are the client's, not the server's"
    res.observe(
        "cpu_s_per_answer_warm",
        hi.mean(hi.cpu_s),
        _warm_cpu(m),
        3,
        why_missing=why if m.through_server else None,
    )
    res.observe("cost_per_answer_cold_usd", hi.mean(hi.usd), cold.mean(cold.usd), 8)
    res.observe("cost_per_answer_warm_usd", hi.mean(hi.usd), warm.mean(warm.usd), 8)


def not_isolated(cold: Row, f: Figures) -> str | None:
    """Why the cold row was not cold, or None: every cold request carries a fresh cache
    salt, so a server that still serves its prompt from the cache ignores the salt (llama.cpp
    keeps each slot's last prompt whatever the salt)."""
    reused = sum(cold.reused_tokens)
    if reused == 0:
        return None
    return (
        f"the server served {f.say('cold_reused_tokens', reused)} of the cold requests' "
        f"{f.say('cold_prompt_tokens', sum(cold.prompt_tokens))} prompt "
        "tokens from its cache despite a fresh cache_salt per request: it does not isolate "
        "by cache_salt, so no request here was cold"
    )


def _row(m: Measured, kind: Kind) -> Row:
    return next(r for r in m.rows if r.kind == kind)


def _warm_cpu(m: Measured) -> float | None:
    """The warm row's CPU seconds per answer, its one cache write spread over its answers."""
    warm = _row(m, "warm")
    if not warm.cpu_s or m.write.cpu_s is None:
        return None
    return (sum(warm.cpu_s) + m.write.cpu_s) / len(warm.cpu_s)


def tables(session: Session, res: DemoResult, m: Measured, judged: Judged) -> None:
    c, money, f = DEMO.config(session.cfg), session.cfg.cost.currency, res.figures
    card = session.cfg.cost.card()
    dated_card = _dated_card(session, card) if m.dated else None
    dated_label = "" if dated_card is None else _card_label(dated_card)
    warm, s = _row(m, "warm"), m.slice
    n = len(warm.correct)
    n_cold = len(_row(m, "cold").correct)
    task = Table(
        "long_vs_retrieval_task",
        "task",
        f"Demonstration 11: the whole corpus slice in the prompt against BM25 at each k, on "
        f"the same {n} questions",
        "measured",
        [
            Column("setting"),
            Column("questions answered"),
            Column("answers right"),
            Column("accuracy %", 1),
            Column("95 % interval low", 1),
            Column("95 % interval high", 1),
            Column("whole corpus (warm) minus this row, points", 1),
            Column("paired 95 % low", 1),
            Column("paired 95 % high", 1),
            Column("McNemar p", 3),
            Column("evidence in the prompt %", 1),
            Column("citation precision %", 1),
            Column("citation recall %", 1),
        ],
        note=f"the slice: {f.say('organisations', s.organisations)} of the fixture's "
        f"{f.say('of_organisations', s.of_organisations)} organisations, "
        f"{f.say('documents', s.documents)} documents (newest versions) in "
        f"{f.say('chunks', s.chunks)} chunks, {f.say('corpus_tokens', s.corpus_tokens)} tokens "
        f"of passages; {f.say('answered', n)} of its {f.say('slice_questions', s.questions)} "
        f"gold questions (a seeded subset, seed {f.say('fixture_seed', c.fixture_seed)}), "
        f"greedy answers of at most {f.say('answer_tokens', c.answer_tokens)} tokens; the "
        f"cold row answered the first {f.say('cold_answered', n_cold)} "
        "of them (the same prompts as the warm row). Accuracy: the gold answer as whole words "
        "in the answer, Wilson's interval; the paired columns compare each row with the warm "
        "whole-corpus row over the questions the row answered (paired bootstrap, exact "
        "McNemar); evidence: the share of a question's evidence sentences held by a passage "
        "in the prompt; citations the model did not write are attributed to the passage "
        "holding the most answer words",
    )
    serving = Table(
        "long_vs_retrieval_serving",
        "serving",
        "Demonstration 11: what each answer computed, and how soon it began",
        "measured",
        [
            Column("setting"),
            Column("requests"),
            Column("prompt tokens per answer", 1),
            Column("reused tokens per answer", 1),
            Column("TTFT median ms", 1),
            Column("TTFT 95 % low ms", 1),
            Column("TTFT 95 % high ms", 1),
            Column("CPU s per answer", 3),
        ],
        note="one request at a time (no batch queue in the TTFT), the rows interleaved "
        "question by question so they share the machine's state; reused: prompt tokens the "
        "prefix cache served (a retrieval row shares only its system prompt between "
        "questions, under its own cache salt; each cold request a salt nothing was cached "
        "under); TTFT median with the bootstrap 95 % interval of the median; CPU: this "
        "process around the "
        f"request, the warm row's one cache write ({f.say('write_ttft_ms', m.write.ttft_ms, 1)} "
        "ms to its first "
        "token) spread over its answers"
        + (" (not reported through a server: the client's)" if m.through_server else ""),
    )
    cost = Table(
        "long_vs_retrieval_cost",
        "cost",
        "Demonstration 11: the hosted price of one answer, and which side wins",
        "measured",
        [
            Column("setting"),
            Column("context tokens per question", 1),
            Column(f"hosted {money} per 1,000 answers", 4),
            Column("x whole corpus (warm)", 2),
            *([Column(f"hosted {money} per 1,000 answers, dated card", 4)] if dated_label else []),
            Column(f"self-hosted {money} per 1,000 answers (CPU time)", 4),
            Column("whole corpus (warm) against this row"),
        ],
        note=f"priced with {_card_label(card)}: exact prompt and output tokens of each answer; "
        f"the warm row's {f.say('shared_prefix_tokens', s.shared_prefix_tokens)} shared "
        "prefix tokens are one cache write "
        "(spread over its answers) and a cache read per answer, the rest of its prompt "
        "uncached input; other rows all uncached input. The last column: answers better or "
        "worse beyond noise (the paired interval of the task table) or within noise, and "
        "which costs less per answer (and which starts its answer sooner, where the paired "
        "interval of the median TTFT difference excludes zero); the provider's cache storage "
        "per hour is not priced"
        + (f"; dated card: {dated_label}, priced the same way" if dated_label else "")
        + f"; self-hosted: the CPU seconds per answer at {f.say('cpu_hourly', m.cpu_hourly, 2)} "
        f"{money} an hour",
    )
    base = _per_1000(warm) or 0.0
    for i, row in enumerate(m.rows):
        acc = row.accuracy()
        if row is warm:
            change: tuple[float | None, ...] = (None, None, None, None)
        else:
            p = against(row, warm)
            ci = points(p)
            change = (ci.value, ci.low, ci.high, p.mcnemar_p)
        task.add(
            label(row),
            len(row.correct),
            sum(row.correct),
            100 * acc.value,
            100 * acc.low,
            100 * acc.high,
            *change,
            _pct(row.mean(row.evidence)),
            _pct(row.mean(row.precisions)),
            _pct(row.mean(row.citation_recalls)),
        )
        ttft = stats.median_interval(row.ttft_ms)
        cpu = _warm_cpu(m) if row is warm else row.mean(row.cpu_s)
        serving.add(
            label(row),
            len(row.ttft_ms),
            row.mean(row.prompt_tokens),
            row.mean(row.reused_tokens),
            ttft.value,
            ttft.low,
            ttft.high,
            cpu,
        )
        per = _per_1000(row)
        judged_row = judged.of(i)
        if judged_row is not None:
            verdict = said(judged_row, row)
        elif row is warm:
            verdict = "(the reference)"
        else:
            verdict = "the same prompts, nothing reused"
        dated = row.mean(row.usd_dated)
        cost.add(
            label(row),
            row.mean(row.context_tokens),
            per,
            None if per is None or base == 0 else per / base,
            *([None if dated is None else 1000 * dated] if dated_label else []),
            None if cpu is None else cpu * m.cpu_hourly / 3.6,
            verdict,
        )
    res.tables += [task, serving, cost]


def explain(session: Session, res: DemoResult, m: Measured, judged: Judged) -> None:
    """Summary, the gains (storage terms and product terms) and notes; every number from
    `res.figures.say`."""
    f, money, s = res.figures, session.cfg.cost.currency, m.slice
    retrieval = [r for r in m.rows if r.kind == "retrieval"]
    cold, warm = _row(m, "cold"), _row(m, "warm")
    n = len(warm.correct)
    best = m.rows[judged.best]
    decision = judged.of(judged.best)
    assert decision is not None
    won = [m.rows[c.row] for c in judged.comparisons if c.wins]
    f.say("slot_bytes", m.slot_bytes)
    res.summary = (
        f"{f.say('organisations', s.organisations)} of the seeded corpus's organisations "
        f"({f.say('chunks', s.chunks)} chunks, {f.say('corpus_tokens', s.corpus_tokens)} "
        "tokens of passages) placed whole in the prompt, cold and with the prefix cache warm, "
        f"against BM25 at k = {', '.join(str(r.k) for r in retrieval)} over the same slice, "
        f"on {f.say('answered', n)} of its gold questions: "
        + (
            "the whole corpus (warm) wins against "
            + ", ".join(label(r) for r in won)
            + " (answers better beyond noise, or within noise for less)."
            if won
            else "the whole corpus wins against no k here (it answers worse beyond noise, "
            "or within noise at a higher price)."
        )
    )
    # the prefix cache: warm against cold, the same prompts (no case where nothing was cold)
    med_warm = stats.median(warm.ttft_ms)
    cold_gain = "whole corpus: warm prefix cache against cold"
    if not_isolated(cold, f) is not None:
        res.gains.append(Gain(cold_gain, None, None))
    else:
        res.gains.append(_cold_gain(f, m, cold_gain, money))
    # the decision: the whole corpus (warm) against the k that answered most
    p = against(best, warm)
    ci = points(p)
    acc_w, acc_b = warm.accuracy(), best.accuracy()
    name = label(best)
    answers = {
        "whole corpus": "the whole corpus answers better beyond noise",
        "retrieval": f"{name} answers better beyond noise",
        "neither": "the two answer within noise of each other",
    }[decision.better]
    prompt_best, prompt_warm = best.mean(best.prompt_tokens) or 0.0, warm.mean(warm.prompt_tokens)
    best_kv = prompt_best * m.slot_bytes / 2**20
    computed_warm = (prompt_warm or 0.0) - (warm.mean(warm.reused_tokens) or 0.0)
    computed_best = prompt_best - (best.mean(best.reused_tokens) or 0.0)
    ev_best, ev_warm = _pct(best.mean(best.evidence)), _pct(warm.mean(warm.evidence))
    res.gains.append(
        Gain(
            f"the decision: whole corpus (warm) against {name}, the k that answered most",
            f"{name} puts {f.say('context_best', best.mean(best.context_tokens), 1)} "
            f"tokens of passages in a prompt ({f.say('prompt_best', prompt_best, 1)} prompt "
            f"tokens, {f.say('kv_best_mib', best_kv, 2)} MiB of KV while it runs) holding "
            f"{f.say('evidence_best_pct', ev_best, 1)}% of the evidence; the whole corpus puts "
            f"{f.say('context_warm', warm.mean(warm.context_tokens), 1)} tokens there, holding "
            f"{f.say('evidence_warm_pct', ev_warm, 1)}%, and computes "
            f"{f.say('computed_warm', computed_warm, 1)} of them per answer once the corpus "
            f"is cached, against {f.say('computed_best', computed_best, 1)} for {name}",
            f"{f.say('right_warm', sum(warm.correct))} of {n} answers right "
            f"({f.say('acc_warm_pct', 100 * acc_w.value, 1)}%, 95 % interval "
            f"[{f.say('acc_warm_low', 100 * acc_w.low, 1)}, "
            f"{f.say('acc_warm_high', 100 * acc_w.high, 1)}]) against "
            f"{f.say('right_best', sum(best.correct))} "
            f"({f.say('acc_best_pct', 100 * acc_b.value, 1)}%, "
            f"[{f.say('acc_best_low', 100 * acc_b.low, 1)}, "
            f"{f.say('acc_best_high', 100 * acc_b.high, 1)}]): "
            f"{answers} (paired 95 % interval of the difference "
            f"[{f.say('diff_low_pts', ci.low, 1)}, {f.say('diff_high_pts', ci.high, 1)}] "
            f"points, McNemar p {f.say('mcnemar_p', p.mcnemar_p, 3)}); a median first token "
            f"after {f.say('ttft_warm_ms', med_warm, 1)} ms against "
            f"{f.say('ttft_best_ms', stats.median(best.ttft_ms), 1)} ms, at "
            f"{f.say('usd_1000_warm', _per_1000(warm), 4)} against "
            f"{f.say('usd_1000_best', _per_1000(best), 4)} {money} per 1,000 answers: "
            + ("long context wins here" if decision.wins else f"{name} is the better buy"),
        )
    )
    res.notes.append(
        f"Accuracy over {n} questions moves in steps of {f.say('step_pct', 100 / n, 1)} "
        "points per question; a side is said to answer better only when the paired 95 % "
        "interval of the difference excludes zero. The cold row asks only the first "
        f"{f.say('n_cold', len(cold.texts))} questions: its prompts are the warm row's, so "
        "its figures of interest are time and price."
    )
    not_cold = not_isolated(cold, f)
    if not_cold is not None:
        res.notes.append(
            f"The cold row was not cold: {not_cold}. Its TTFT is the cache's, not a prefill's."
        )
    kept = warm.mean(warm.reused_tokens) or 0.0
    if kept < s.shared_prefix_tokens / 2:
        res.notes.append(
            f"The warm row was not warm: the cache served "
            f"{f.say('reused_warm', kept, 1)} of the "
            f"{f.say('shared_prefix_tokens', s.shared_prefix_tokens)} shared tokens per answer "
            "(the requests between two questions evicted the corpus: a slot cache such as "
            "llama.cpp's keeps one prompt per slot), so its TTFT and CPU are mostly a prefill's."
        )
    res.notes.append(
        "Hosted prices assume the provider caches the whole shared prefix, as this engine's "
        "prefix cache does in whole pages; providers set a minimum cacheable length and "
        "bill cache storage by the hour, which this table does not price. The slice is what "
        "fits the configured window: a longer corpus costs more per cold answer and, for "
        "a small model, buries the evidence deeper."
    )


def _cold_gain(f: Figures, m: Measured, what: str, money: str) -> Gain:
    """The prefix cache's gain on the whole corpus: warm against cold, the same prompts."""
    s, cold, warm = m.slice, _row(m, "cold"), _row(m, "warm")
    kv_mib = s.shared_prefix_tokens * m.slot_bytes / 2**20
    med_warm, med_cold = stats.median(warm.ttft_ms), stats.median(cold.ttft_ms)
    return Gain(
        what,
        f"the {f.say('shared_prefix_tokens', s.shared_prefix_tokens)} tokens every "
        f"question's prompt shares are held once in the prefix cache "
        f"({f.say('shared_prefix_kv_mib', kv_mib, 2)} MiB of KV at "
        f"{f.say('slot_bytes', m.slot_bytes)} bytes a token) and read back: "
        f"{f.say('reused_warm', warm.mean(warm.reused_tokens), 1)} of "
        f"{f.say('prompt_warm', warm.mean(warm.prompt_tokens), 1)} prompt tokens per "
        f"answer reused, against {f.say('reused_cold', cold.mean(cold.reused_tokens), 1)} "
        "cold",
        f"the first token after a median {f.say('ttft_warm_ms', med_warm, 1)} ms instead "
        f"of {f.say('ttft_cold_ms', med_cold, 1)} ms "
        f"({f.say('n_warm', len(warm.ttft_ms))} and {f.say('n_cold', len(cold.ttft_ms))} "
        f"requests), and {f.say('usd_1000_warm', _per_1000(warm), 4)} instead of "
        f"{f.say('usd_1000_cold', _per_1000(cold), 4)} {money} per 1,000 answers; the "
        f"cold answers were the warm ones in {f.say('same_answers', _same(cold, warm))} "
        f"of {f.say('n_cold', len(cold.texts))} cases (the same prompts)",
    )


def _same(a: Row, b: Row) -> int:
    """How many of `a`'s answers `b` gave word for word to the same question."""
    got = dict(zip(b.questions, b.texts, strict=True))
    return sum(got.get(q) == text for q, text in zip(a.questions, a.texts, strict=True))


def run(session: Session, tracker: Tracker) -> DemoResult:
    from ctxlab.workshop.server_demos import not_measurable

    try:
        m = measure(session, tracker)
    except Unanswered as exc:
        if not session.requests.label:  # the local engine refused: one sentence, as ever
            from ctxlab.errors import CtxlabError

            raise CtxlabError(f"long_vs_retrieval: {exc}.") from None
        c = DEMO.config(session.cfg)
        return not_measurable(
            DEMO,
            f"{exc}; the whole-corpus prompt holds long_vs_retrieval.context_tokens "
            f"({c.context_tokens}) of passages plus a question, so the server must accept "
            "that many tokens per request (lower context_tokens, or serve a longer window)",
        )
    res = DemoResult.of(DEMO, "run", "measured")
    judged = verdicts(res, m)
    tables(session, res, m, judged)
    explain(session, res, m, judged)
    money = session.cfg.cost.currency
    res.plots.append(draw(m, money, DEMO.plot("11_long_vs_retrieval.png").path(session.out)))
    return res


def draw(m: Measured, money: str, path: Path) -> Path:
    """Per row: answers right with Wilson 95 % intervals (left); median TTFT with the
    bootstrap 95 % interval of the median, and the hosted price per 1,000 answers (right)."""
    from ctxlab.workshop.plots import figure, save

    fig, (left, right) = figure()
    names = [label(r) for r in m.rows]
    x = list(range(len(m.rows)))
    acc = [r.accuracy() for r in m.rows]
    left.errorbar(
        x,
        [100 * a.value for a in acc],
        yerr=[[100 * (a.value - a.low) for a in acc], [100 * (a.high - a.value) for a in acc]],
        fmt="o",
        capsize=3,
    )
    for i, (a, r) in enumerate(zip(acc, m.rows, strict=True)):
        left.annotate(
            f"n={len(r.answers)}", (i, 100 * a.high), fontsize=6, ha="center", va="bottom"
        )
    left.set_xticks(x, names, rotation=30, fontsize=7)
    left.set_ylim(-5, 110)
    left.set_ylabel("% answered right (95 % interval)")
    left.set_title("answers")
    left.grid(alpha=0.3)
    costs = [1000 * (r.mean(r.usd) or 0.0) for r in m.rows]
    right.bar(x, costs, color="tab:grey", alpha=0.5, label=f"hosted {money} per 1,000 answers")
    right.set_ylabel(f"hosted {money} per 1,000 answers")
    right.set_xticks(x, names, rotation=30, fontsize=7)
    ttft = [stats.median_interval(r.ttft_ms) for r in m.rows]
    twin = right.twinx()
    twin.errorbar(
        x,
        [t.value for t in ttft],
        yerr=[[t.value - t.low for t in ttft], [t.high - t.value for t in ttft]],
        fmt="s",
        color="tab:red",
        capsize=3,
        label="TTFT median ms (95 % interval)",
    )
    twin.set_ylabel("TTFT median ms (95 % interval)", color="tab:red")
    twin.set_ylim(bottom=0)
    right.set_title("price (bars) and time to first token (points)")
    right.grid(alpha=0.3, axis="y")
    return save(fig, path)


# -- declarations ---------------------------------------------------------------------------
class LongContextSection(Section):
    """Demonstration 11: a corpus slice whole in the prompt against BM25 at each k."""

    context_tokens: Pos  # the whole-corpus prompt's passages stay within this
    k_values: list[Pos] = Field(min_length=1)
    answer_questions: Pos  # a seeded subset of the slice's gold questions (all, if fewer)
    cold_questions: Pos  # of those, asked cold too (a fresh cache salt each)
    answer_tokens: Pos
    order: Literal["relevance", "edges"]
    metadata: Literal["never", "always"]  # "auto" would change the system prompt per question
    fixture_seed: Seed
    fixture_organisations: Annotated[int, Field(ge=6)]  # the corpus (about 400 tokens each)

    @model_validator(mode="after")
    def _shape(self) -> LongContextSection:
        if self.fixture_organisations % 2:
            raise ValueError("fixture_organisations must be even (half have a second version)")
        if sorted(set(self.k_values)) != self.k_values:
            raise ValueError("k_values must be distinct and in increasing order")
        if self.answer_questions < 2:
            raise ValueError("answer_questions must be at least 2 (a shared prefix needs two)")
        if self.cold_questions > self.answer_questions:
            raise ValueError(
                f"cold_questions {self.cold_questions} is more than the "
                f"{self.answer_questions} answered questions"
            )
        return self


def check(c: LongContextSection, cfg: CommonConfig) -> None:
    prompt = c.context_tokens + QUESTION_TOKENS + c.answer_tokens
    fits(cfg, "long_vs_retrieval.context_tokens with a question and its answer", prompt)
    # a cold request (a salt of its own) prefills the corpus beside the warm row's cached
    # copy: a pool that cannot hold both evicts the warm corpus, and the warm row is not warm
    if c.cold_questions > 1 and 2 * prompt > cfg.engine.kv_pool_tokens:
        raise ValueError(
            f"long_vs_retrieval: the warm corpus cached beside a cold request needs "
            f"{2 * prompt} tokens of pool, more than engine.kv_pool_tokens "
            f"{cfg.engine.kv_pool_tokens}; raise it or set cold_questions = 1"
        )


_HI = "BM25 at the largest k"
_WARM = "whole corpus in the prompt, prefix cache warm"
METRICS = (
    Metric("answer_accuracy_pct", "%", _HI, _WARM, "answers matching the gold answer"),
    Metric("evidence_recall_pct", "%", _HI, _WARM, "evidence sentences the prompt holds"),
    Metric("citation_precision_pct", "%", _HI, _WARM, "cited chunks that are gold"),
    Metric(
        "context_tokens_per_question", "tokens", _HI, _WARM, "tokens the passages add to a prompt"
    ),
    Metric(
        "ttft_cold_ms",
        "ms",
        _HI,
        "whole corpus in the prompt, nothing cached (median)",
        "time to the first token of an answer",
    ),
    Metric(
        "ttft_warm_ms",
        "ms",
        "whole corpus, nothing cached (median)",
        "whole corpus, prefix cache warm (median)",
        "time to the first token of an answer",
    ),
    Metric(
        "ttft_warm_vs_retrieval_ms",
        "ms",
        f"{_HI} (median)",
        f"{_WARM} (median)",
        "time to the first token of an answer",
    ),
    Metric(
        "cpu_s_per_answer_warm",
        "s",
        _HI,
        f"{_WARM} (its one cache write spread over its answers)",
        "CPU seconds the engine spent per answer",
    ),
    Metric(
        "cost_per_answer_cold_usd",
        "USD",
        _HI,
        "whole corpus in the prompt, all of it uncached input",
        "hosted price of one answer under the workshop's rate card",
    ),
    Metric(
        "cost_per_answer_warm_usd",
        "USD",
        _HI,
        f"{_WARM} (one cache write, a cache read per answer)",
        "hosted price of one answer under the workshop's rate card",
    ),
)

TOML = """\
# -- 11: long context against retrieval, at equal cost ---------------------------------------
[long_vs_retrieval]
context_tokens = 2048         # the slice of demonstration 6's corpus placed whole in the prompt:
                              # whole organisations while their passages fit (5 of 24)
k_values = [1, 4]             # BM25 over the same slice at each k (--full: 1, 2, 4, 8)
answer_questions = 16         # a seeded subset of the slice's gold questions, every row
cold_questions = 2            # of those, also asked with nothing cached (a full prefill each;
                              # the first is also the warm row's one cache write)
answer_tokens = 12            # greedy answers of at most this many tokens
order = "relevance"           # retrieved passages best first, or "edges"
metadata = "never"            # passage dates: never or always (the same prompt prefix for
                              # every question; on this corpus demonstration 6's "auto" is "never")
fixture_seed = 0
fixture_organisations = 24    # organisations in the seeded corpus (even; about 400 tokens of
                              # passages each on smollm2-135m): more for a longer slice
"""

PREDICTIONS_TOML = """\
[predictions.long_vs_retrieval] # baseline: BM25 at the largest k, unless noted
# a 135M model answers worse from 36 chunks than from 4 (demonstration 6: k = 8 below k = 4)
answer_accuracy_pct = { direction = "down" }
# the whole slice holds every evidence sentence; the top k only some
evidence_recall_pct = { direction = "up", range = [100, 100] }
# ~1,900 tokens of passages against ~260 at k = 4 (64-token chunks)
context_tokens_per_question = { direction = "up" }
# a cold whole-corpus answer prefills ~7x the tokens
ttft_cold_ms = { direction = "up" }
cost_per_answer_cold_usd = { direction = "up" }
# baseline: the whole corpus cold; warm computes only the question (~30 of ~2,000 tokens)
ttft_warm_ms = { direction = "down", tolerance = 0.5 }
# warm computes ~30 new tokens against ~300 for k = 4: the first token comes sooner
ttft_warm_vs_retrieval_ms = { direction = "down" }
# planner arithmetic (2 FLOPs per parameter per token): one 2,000-token write over 16
# answers (~125 tokens each) plus ~30 new tokens and decode over a 2K cache, against ~300
# tokens prefilled per k = 4 answer: about even
cpu_s_per_answer_warm = { direction = "unchanged", tolerance = 0.5 }
# default prices: 2,000 tokens read at 0.30 plus one write at 3.75 over 16 answers against
# ~400 uncached tokens at 3.00 per million: about even
cost_per_answer_warm_usd = { direction = "unchanged", tolerance = 0.5 }
"""

QUICK_TOML = """\
[quick.long_vs_retrieval]
context_tokens = 640          # fits a 1,024-token pool (a server's, e.g. the tests' ctxlab serve)
k_values = [1, 4]
answer_questions = 6          # --quick: 6 questions, said so beside every figure
cold_questions = 2
"""

FULL_TOML = """\
[full.long_vs_retrieval]
context_tokens = 3700         # as much of the corpus as max_model_len 4096 leaves room for
k_values = [1, 2, 4, 8]
answer_questions = 48         # (about 11 organisations; a 6K slice needs max_model_len 6400)
cold_questions = 8
"""


DEMO = Demonstration(
    number=11,
    key="long_vs_retrieval",
    title="Long context against retrieval, at equal cost",
    section=LongContextSection,
    metrics=METRICS,
    layers=("task", "serving", "cost"),
    steps=steps,
    run=run,
    toml=TOML,
    predictions_toml=PREDICTIONS_TOML,
    quick_toml=QUICK_TOML,
    full_toml=FULL_TOML,
    check=check,
    required=("answer_accuracy_pct",),
    server=ServerMode(through=True, needs_cached_tokens=True),
    plots=(
        Plot(
            "11_long_vs_retrieval.png",
            "per setting, answers right (95 % intervals) beside the median time to the first "
            "token (95 % interval) and the hosted price per 1,000 answers",
        ),
    ),
)
