"""`ctxlab rag`: ingest documents, ask with citations, and evaluate on the seeded fixture.

Backend flags are the same as `ctxlab memory`'s (both take them from `_app_options.py`).
Chunks are cut in the tokens of `--model` (its tokenizer only; the weights load only to
answer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ctxlab.commands._app_options import (
    ApiKeyOpt,
    BackendOpt,
    BaseUrlOpt,
    DbOpt,
    RetrieverOpt,
    ServedModelOpt,
    TimeoutOpt,
    TokenizerOpt,
    default_out,
    make_backend,
    parse_list,
)
from ctxlab.commands.options import (
    DEFAULT_MODEL,
    DTypeOpt,
    JsonOpt,
    ModelOpt,
    SeedOpt,
    ThreadsOpt,
    output_dir,
    set_threads,
)
from ctxlab.errors import CtxlabError
from ctxlab.json_output import dumps
from ctxlab.outputs import write_text

if TYPE_CHECKING:
    from ctxlab.memory.store import Store

rag_app = typer.Typer(
    help="Retrieval with citations: ingest, ask, evaluate (recall@k, accuracy, cost).",
    no_args_is_help=True,
)
ChunkOpt = typer.Option(64, "--chunk-tokens", help="Tokens per chunk (the model's tokens).")
OverlapOpt = typer.Option(8, "--overlap-tokens", help="Tokens shared by consecutive chunks.")
MetadataOpt = typer.Option(
    "auto",
    "--metadata",
    help="Passage dates in the prompt: auto (only for questions about versions or time), "
    "always, never.",
)
OrderOpt = typer.Option(
    "relevance", "--order", help="Passage order: relevance, or edges (against lost-in-the-middle)."
)


@rag_app.command("ingest")
def ingest(
    paths: list[Path] = typer.Argument(..., help="Files (.txt, .md, .pdf) or folders."),
    db: DbOpt = None,
    chunk_tokens: int = ChunkOpt,
    overlap_tokens: int = OverlapOpt,
    model: ModelOpt = DEFAULT_MODEL,
    as_json: JsonOpt = False,
) -> None:
    """Chunk and index documents (a changed one gets a new version, an unchanged one is skipped)."""
    from ctxlab.memory.embed import WordLlamaEmbedder
    from ctxlab.memory.engine_backend import EngineBackend
    from ctxlab.memory.store import open_store
    from ctxlab.progress import progress
    from ctxlab.rag.chunking import check_sizes
    from ctxlab.rag.documents import ingest as ingest_one
    from ctxlab.rag.readers import collect, hidden_entries

    check_sizes(chunk_tokens, overlap_tokens)
    docs = collect(list(paths))  # every file read and checked before anything is written
    results = []
    with open_store(db) as store:  # a read-only store is refused before the tokenizer loads
        tokenizer = EngineBackend(model)
        embedder = WordLlamaEmbedder()
        with progress("ingesting", len(docs)) as bar:
            for doc in docs:
                results.append(
                    ingest_one(store, doc, tokenizer, embedder, chunk_tokens, overlap_tokens, model)
                )
                bar.advance()
        where = store.path
    if as_json:
        typer.echo(dumps([r.__dict__ for r in results]))
        return
    for r in results:
        typer.echo(f"{r.doc_id} v{r.version} ({r.date}): {r.status}, {r.chunks} chunks")
    counts = {s: sum(r.status == s for r in results) for s in ("new", "new version", "unchanged")}
    hidden = hidden_entries(list(paths))
    skipped = f", {hidden} hidden entries (named with a leading dot) skipped" if hidden else ""
    typer.echo(
        f"{counts['new']} new, {counts['new version']} new versions, {counts['unchanged']} "
        f"unchanged{skipped} -> {where}"
    )


@rag_app.command("docs")
def docs(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """List the documents in the store, every version."""
    from ctxlab.memory.store import open_store
    from ctxlab.rag.documents import documents

    with open_store(db, must_exist=True, write=False) as store:
        rows = documents(store)
    if as_json:
        typer.echo(dumps([r.__dict__ for r in rows]))
        return
    if not rows:
        typer.echo("no documents")
    for r in rows:
        typer.echo(f"{r.doc_id} v{r.version} {r.date} {r.chunks} chunks  {r.title}")


@rag_app.command("ask")
def ask(
    question: str = typer.Argument(..., help="The question."),
    k: int = typer.Option(4, "--k", help="Passages to retrieve."),
    retriever: RetrieverOpt = "bm25",
    order: str = OrderOpt,
    metadata: str = MetadataOpt,
    as_of: str = typer.Option(None, "--as-of", help="Answer from versions dated on or before."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Tokens of the answer."),
    db: DbOpt = None,
    model: ModelOpt = DEFAULT_MODEL,
    dtype: DTypeOpt = "float32",
    backend: BackendOpt = "ctxlab",
    base_url: BaseUrlOpt = None,
    served_model: ServedModelOpt = "default",
    api_key: ApiKeyOpt = "none",
    timeout: TimeoutOpt = 600.0,
    tokenizer: TokenizerOpt = None,
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Answer from the newest version of each document, citing passages as doc#chunk."""
    from ctxlab.memory.search import check_retriever
    from ctxlab.memory.store import open_store
    from ctxlab.progress import progress
    from ctxlab.rag.answer import check_metadata
    from ctxlab.rag.ask import ask as ask_question
    from ctxlab.rag.readers import check_date
    from ctxlab.rag.retriever import order_passages

    check_retriever(retriever)
    order_passages([], order)
    check_metadata(metadata)
    if as_of:
        check_date(as_of, "--as-of")
    if k < 1 or max_tokens < 1:
        raise CtxlabError("--k and --max-tokens must be at least 1.")
    if not question.strip():
        raise CtxlabError("the question is empty; ask something.")
    set_threads(threads)
    with open_store(db, must_exist=True, write=False) as store:
        _check_something_to_retrieve(store, as_of)
    engine = make_backend(
        backend, model, base_url, served_model, api_key, tokenizer, dtype, timeout=timeout
    )
    with open_store(db, must_exist=True, write=False) as store, progress("answering"):
        answer = ask_question(
            engine, store, question, k, retriever, order, as_of, max_tokens, metadata=metadata
        )
    if not answer.passages:
        typer.echo("note: nothing was retrieved, so the answer cites no passage.", err=True)
    passages = [
        {"key": p.key, "version": p.version, "date": p.date, "rank": p.rank, "text": p.text}
        for p in answer.passages
    ]
    if as_json:
        typer.echo(
            dumps(
                {
                    "question": question,
                    "answer": answer.text,
                    "citations": answer.citations,
                    "cited_by": answer.cited_by,
                    "prompt_tokens": answer.prompt_tokens,
                    "passages": passages,
                    "seconds": {name: round(v, 4) for name, v in answer.seconds.items()},
                }
            )
        )
        return
    cites = " ".join(f"[{c}]" for c in answer.citations) or "(none)"
    typer.echo(answer.text)
    typer.echo(f"citations: {cites} ({answer.cited_by})")
    for p in passages:
        typer.echo(f"  [{p['key']}] v{p['version']} {p['date']}: {p['text'][:100]}")


def _check_something_to_retrieve(store: Store, as_of: str | None) -> None:
    """Refuse a question no stored version can answer (an empty store, or --as-of before
    every document's date) before the model loads, with the sentence that says why."""
    from ctxlab.rag.documents import documents

    dates = sorted(d.date for d in documents(store))
    if not dates:
        raise CtxlabError(
            f"{store.path} holds no documents; ingest some first (ctxlab rag ingest)."
        )
    if as_of is not None and as_of < dates[0]:
        raise CtxlabError(
            f"no document version is dated on or before --as-of {as_of} (the oldest is "
            f"{dates[0]}), so nothing can be retrieved."
        )


@rag_app.command("eval")
def evaluate(
    paths: list[Path] = typer.Argument(
        None, help="A corpus (files or folders); none: the seeded fixture."
    ),
    questions: Path = typer.Option(
        None, "--questions", help="Gold questions for a named corpus (JSON lines, see fixture)."
    ),
    k: str = typer.Option("1,2,4,8", "--k", help="Comma list of k for recall@k and MRR."),
    retriever: str = typer.Option(
        "bm25,dense,hybrid", "--retriever", help="Comma list of retrievers to compare."
    ),
    answer_k: int = typer.Option(2, "--answer-k", help="Passages given to the model per question."),
    answer_retriever: str = typer.Option(
        "bm25", "--answer-retriever", help="Comma list of retrievers whose answers are scored."
    ),
    no_answers: bool = typer.Option(
        False, "--no-answers", help="Retrieval and token counts only; no model."
    ),
    closed_book: bool = typer.Option(
        False, "--closed-book", help="Add a row answered with no passages."
    ),
    limit: int = typer.Option(None, "--limit", help="Only the first N of the 100 questions."),
    order: str = OrderOpt,
    metadata: str = MetadataOpt,
    answer_tokens: int = typer.Option(16, "--answer-tokens", help="Tokens per answer."),
    cost_samples: int = typer.Option(
        4, "--cost-samples", help="Questions whose prefill is timed, per k."
    ),
    price_input: float = typer.Option(
        0.10, "--price-input", help="USD per million input tokens (illustrative default)."
    ),
    price_output: float = typer.Option(
        0.40, "--price-output", help="USD per million output tokens (illustrative default)."
    ),
    chunk_tokens: int = ChunkOpt,
    overlap_tokens: int = OverlapOpt,
    seed: SeedOpt = 0,
    db: Path = typer.Option(
        None, "--db", help="Store to ingest the fixture into (default: a temporary one)."
    ),
    model: ModelOpt = DEFAULT_MODEL,
    dtype: DTypeOpt = "float32",
    backend: BackendOpt = "ctxlab",
    base_url: BaseUrlOpt = None,
    served_model: ServedModelOpt = "default",
    api_key: ApiKeyOpt = "none",
    timeout: TimeoutOpt = 600.0,
    tokenizer: TokenizerOpt = None,
    out: Path = typer.Option(None, "--out", help="Output folder (default out/rag-eval-TIMESTAMP)."),
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask the seeded fixture's 100 gold questions: retrieval, task and cost tables.

    With no corpus named the seeded fixture is used, ingested into --db or a temporary store.

    The verdict says whether the model or the retrieval is the limit (gold passages alone).
    """
    from ctxlab.plan.cost import HostedPrices
    from ctxlab.rag.evaluate import EvalOptions
    from ctxlab.rag.evaluate import evaluate as run_eval

    try:
        ks = tuple(int(x) for x in parse_list(k, "--k"))
    except ValueError:
        raise CtxlabError(f"--k must be comma-separated whole numbers, got {k!r}.") from None
    options = EvalOptions(
        ks=ks,
        retrievers=tuple(parse_list(retriever, "--retriever")),
        answer_k=answer_k,
        answer_retrievers=tuple(parse_list(answer_retriever, "--answer-retriever")),
        closed_book=closed_book,
        order=order,
        metadata=metadata,
        answer_tokens=answer_tokens,
        cost_samples=cost_samples,
        prices=HostedPrices(price_input, price_output),
        seed=seed,
        chunk_tokens=chunk_tokens,
        overlap_tokens=overlap_tokens,
        limit=limit,
        answers=not no_answers,
    ).check()
    folder = output_dir(out or default_out("rag-eval"))
    if backend == "openai" and tokenizer is None:
        raise CtxlabError("rag eval with --backend openai needs --tokenizer to cut chunks.")
    corpus = None
    if paths:
        if questions is None:
            raise CtxlabError("a named corpus needs its gold questions: --questions FILE.")
        from ctxlab.rag.evaluate import named_corpus

        corpus = named_corpus(paths, questions)
    elif questions is not None:
        raise CtxlabError("--questions needs the corpus they are about (PATH...).")
    set_threads(threads)
    engine = make_backend(
        backend, model, base_url, served_model, api_key, tokenizer, dtype, timeout=timeout
    )
    report = run_eval(engine, db, options, corpus=corpus)
    doc = report.as_dict()
    write_text(folder / "rag_eval.json", json.dumps(doc, indent=1) + "\n", "--out")
    from ctxlab.rag.plot import plot_eval

    plot_eval(report, folder / "rag_eval.png")
    if as_json:
        typer.echo(dumps(doc))
        return
    print_report(report)
    typer.echo(f"results: {folder / 'rag_eval.json'}, {folder / 'rag_eval.png'}")


def print_report(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    s = report.settings
    console.print(
        f"{s['questions']} questions, {s['documents']} document versions, {s['chunks']} chunks "
        f"of {s['chunk_tokens']} tokens (overlap {s['overlap_tokens']}), model {s['model']}"
    )
    t = Table(
        title=f"Retrieval (evidence chunks found; 95 % interval, n = {s['questions']})",
        title_justify="left",
    )
    for col in ("retriever", "k", "recall@k", "95 % interval", "MRR@k"):
        t.add_column(col, justify="left" if col == "retriever" else "right")
    for r in report.retrieval:
        t.add_row(
            r.retriever,
            str(r.k),
            f"{r.recall:.3f}",
            _ci(r.recall_low, r.recall_high, 3),
            f"{r.mrr:.3f}",
        )
    console.print(t)
    if report.comparisons:
        t = Table(title="recall@k change, paired over the same questions", title_justify="left")
        for col in ("retriever", "against", "k", "change", "95 % interval", "verdict"):
            t.add_column(
                col, justify="left" if col in ("retriever", "against", "verdict") else "right"
            )
        for c in report.comparisons:
            t.add_row(
                c.retriever,
                c.baseline,
                str(c.k),
                f"{c.change:+.3f}",
                _ci(c.low, c.high, 3, signed=True),
                c.verdict,
            )
        console.print(t)
    if report.task:
        t = Table(title="Task (answers)", title_justify="left")
        cols = (
            "setting",
            "accuracy",
            "95 % interval",
            "cite precision (n)",
            "cite recall",
            "cited by model",
        )
        for col in cols:
            t.add_column(col, justify="left" if col == "setting" else "right")
        for r in report.task:
            p = (
                "-"
                if r.citation_precision is None
                else f"{r.citation_precision:.2f} "
                f"{_ci(r.citation_precision_low, r.citation_precision_high, 2)} "
                f"(n={r.citing_answers})"
            )
            t.add_row(
                r.setting,
                f"{r.accuracy:.0%} ({r.correct}/{r.questions})",
                _ci(r.accuracy_low, r.accuracy_high, 0, pct=True),
                p,
                f"{r.citation_recall:.2f} {_ci(r.citation_recall_low, r.citation_recall_high, 2)}",
                f"{r.cited_by_model:.0%}",
            )
        console.print(t)
        kinds = sorted(report.task[0].accuracy_by_kind)
        t = Table(title="Task accuracy by question kind", title_justify="left")
        t.add_column("setting")
        for kind in kinds:
            t.add_column(kind, justify="right")
        for r in report.task:
            t.add_row(r.setting, *[f"{r.accuracy_by_kind[kd]:.0%}" for kd in kinds])
        console.print(t)
    t = Table(title="Cost per question", title_justify="left")
    for col in ("retriever", "k", "prompt tokens", "prefill (s)", "USD / 1k questions"):
        t.add_column(col, justify="left" if col == "retriever" else "right")
    for r in report.cost:
        pre = "-" if r.prefill_s is None else f"{r.prefill_s:.3f} (n={r.prefill_samples})"
        t.add_row(
            r.retriever,
            str(r.k),
            f"{r.prompt_tokens:.0f}",
            pre,
            f"{r.dollars_per_1k_questions:.4f}",
        )
    console.print(t)
    console.print(report.verdict)


def _ci(
    low: float | None, high: float | None, digits: int, pct: bool = False, signed: bool = False
) -> str:
    """'[0.51, 0.70]' (or '[41%, 60%]'); '-' when there is no interval."""
    if low is None or high is None:
        return "-"
    if pct:
        return f"[{low:.{digits}%}, {high:.{digits}%}]"
    sign = "+" if signed else ""
    return f"[{low:{sign}.{digits}f}, {high:{sign}.{digits}f}]"


@rag_app.command("fixture")
def fixture(
    out: Path = typer.Option(Path("out/rag-fixture"), "--out", help="Folder to write to."),
    seed: SeedOpt = 0,
) -> None:
    """Write the seeded corpus (docs/*.md, one file per version) and questions.jsonl."""
    from ctxlab.rag.corpus import corpus_fixture

    folder = output_dir(out)
    docs_dir = corpus_fixture(seed).write(folder)
    typer.echo(f"documents: {docs_dir}\nquestions: {folder / 'questions.jsonl'}")


def register(app: typer.Typer) -> None:
    app.add_typer(rag_app, name="rag")
