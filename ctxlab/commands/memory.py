"""`ctxlab memory`: compaction with a loss report, recall/archival search, core memory, tools.

The backend flags (`--backend ctxlab|openai`, `--base-url`, ...) are shared with
`ctxlab rag` (`_app_options.py`). torch and the model load only inside commands that generate.
"""

from __future__ import annotations

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

if TYPE_CHECKING:
    from ctxlab.memory.loss import CompactionReport

memory_app = typer.Typer(
    help="Application memory: tiered memory, context strategies, compaction loss reports.",
    no_args_is_help=True,
)


@memory_app.command("compact")
def compact(
    history: Path = typer.Option(
        None, "--history", help="History: JSON lines of {role, content, session, created_at}."
    ),
    facts: Path = typer.Option(
        None, "--facts", help="Facts: JSON list of {id, question, answer, message}."
    ),
    strategy: str = typer.Option(
        "truncation,summary-extractive,summary,tiered",
        "--strategy",
        help="Comma list of: truncation, summary, summary-extractive, tiered, compact (the "
        "summary replaces the history and the log is deleted).",
    ),
    window: int = typer.Option(
        1024, "--window", help="Context window in tokens for the replay (below the model's)."
    ),
    reserve: int = typer.Option(64, "--reserve", help="Tokens kept free for the reply."),
    warn: float = typer.Option(0.75, "--warn", help="Pressure share that records a warning."),
    compact_at: float = typer.Option(0.90, "--compact-at", help="Pressure share that compacts."),
    k: int = typer.Option(3, "--k", help="Messages a search returns (recoverable / recalled)."),
    note_position: str = typer.Option(
        "system",
        "--note-position",
        help="Where the summary/recall note goes: system (stable prefix) or turn (next to "
        "the user's turn, where a small model uses it best).",
    ),
    retriever: RetrieverOpt = "hybrid",
    answer_tokens: int = typer.Option(16, "--answer-tokens", help="Tokens per answer."),
    seed: SeedOpt = 0,
    model: ModelOpt = DEFAULT_MODEL,
    dtype: DTypeOpt = "float32",
    backend: BackendOpt = "ctxlab",
    base_url: BaseUrlOpt = None,
    served_model: ServedModelOpt = "default",
    api_key: ApiKeyOpt = "none",
    timeout: TimeoutOpt = 600.0,
    tokenizer: TokenizerOpt = None,
    out: Path = typer.Option(
        None, "--out", help="Output folder (default out/memory-compact-TIMESTAMP)."
    ),
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay a history under each strategy; report per planted fact: kept, recoverable, lost.

    Without --history/--facts the seeded fixture conversation is used.
    """
    from ctxlab.memory.budget import MemoryConfig
    from ctxlab.memory.compaction_run import CompactionSettings, run_compaction
    from ctxlab.memory.fixtures import conversation_fixture, load_fixture_files

    if (history is None) != (facts is None):
        raise CtxlabError("give both --history and --facts, or neither (the seeded fixture).")
    positions = None
    if backend == "ctxlab":  # the window against the model's positions, before it loads
        from ctxlab.model.registry import model_positions

        positions = model_positions(model)
    settings = CompactionSettings(
        MemoryConfig(
            window=window,
            reserve=reserve,
            warn_share=warn,
            compact_share=compact_at,
            retrieve_k=k,
            note_position=note_position,
        ),
        tuple(parse_list(strategy, "--strategy")),
        retriever,
        answer_tokens,
        positions,
    )
    if history is not None and facts is not None:
        messages, fact_list = load_fixture_files(history, facts)
        source = f"{history} + {facts}"
    else:
        fixture = conversation_fixture(seed)
        messages, fact_list = fixture.history, fixture.facts
        source = f"fixture conversation (seed {seed})"
    set_threads(threads)
    folder = output_dir(out or default_out("memory-compact"))
    engine = make_backend(
        backend, model, base_url, served_model, api_key, tokenizer, dtype, window, timeout
    )
    run = run_compaction(settings, messages, fact_list, engine, source, folder)
    if as_json:
        typer.echo(dumps(run.doc))
        return
    _print_compaction(run.doc, run.reports)
    typer.echo(f"results: {run.files[0]}, {run.files[1]}")


def _print_compaction(doc: dict[str, Any], reports: list[CompactionReport]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"{len(reports[0].facts)} planted facts, {doc['source']}; window {doc['window']} "
        f"(reserve {doc['reserve']}); note in the {doc['note_position']} position; "
        f"recoverable = top-{doc['search_k']} {doc['retriever']} recall search finds the "
        "stating message"
    )
    table = Table(title="Compaction", title_justify="left")
    for col in (
        "strategy",
        "kept",
        "recov.",
        "lost",
        "accuracy",
        "tok before",
        "tok after",
        "compactions",
    ):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for r in reports:
        s = r.summary()
        table.add_row(
            s["strategy"],
            str(s["in_context"]),
            str(s["recoverable"]),
            str(s["lost"]),
            f"{s['accuracy']:.0%} [{s['accuracy_low']:.0%}, {s['accuracy_high']:.0%}]",
            f"{s['tokens_before']:,}",
            f"{s['tokens_after']:,}",
            str(s["compactions"]),
        )
    table.add_row("(own message only)", "-", "-", "-", f"{doc['model_ceiling']:.0%}", "-", "-", "-")
    console.print(table)
    facts = Table(title="Per fact: status, answer right (+) or wrong (-)", title_justify="left")
    facts.add_column("fact")
    for r in reports:
        facts.add_column(r.strategy)
    short = {"in_context": "kept", "recoverable": "recov.", "lost": "lost"}
    for i, f in enumerate(reports[0].facts):
        cells = [
            f"{short[r.facts[i].status]} {'+' if r.facts[i].correct else '-'}" for r in reports
        ]
        facts.add_row(f.id, *cells)
    console.print(facts)
    console.print(
        f"loop: {doc['loop']}; accuracy of the row '(own message only)' is the model's ceiling."
    )


@memory_app.command("fixture")
def fixture(
    out: Path = typer.Option(Path("out/memory-fixture"), "--out", help="Folder to write to."),
    seed: SeedOpt = 0,
) -> None:
    """Write the seeded conversation (history.jsonl) and its planted facts (facts.json)."""
    from ctxlab.memory.fixtures import conversation_fixture

    history, facts = conversation_fixture(seed).write(output_dir(out))
    typer.echo(f"history: {history}\nfacts: {facts}")


@memory_app.command("import")
def import_history(
    history: Path = typer.Argument(..., help="History file (JSON lines or a JSON list)."),
    db: DbOpt = None,
    agent: str = typer.Option("default", "--agent", help="Agent whose recall memory to fill."),
) -> None:
    """Store a history's messages in recall memory (one transaction); importing the same
    history again stores nothing twice, and a grown history adds only its new messages."""
    from ctxlab.memory.embed import WordLlamaEmbedder
    from ctxlab.memory.messages import read_history
    from ctxlab.memory.recall import RecallMemory
    from ctxlab.memory.store import open_store

    messages = read_history(history)
    with open_store(db) as store:
        stored, already = RecallMemory(store, WordLlamaEmbedder(), agent).import_history(messages)
        there = f" ({already} already stored, skipped)" if already else ""
        typer.echo(f"stored {len(stored)} messages for agent {agent!r} in {store.path}{there}")


@memory_app.command("search")
def search(
    query: str = typer.Argument(..., help="What to look for."),
    db: DbOpt = None,
    tier: str = typer.Option("recall", "--tier", help="recall (messages) or archival."),
    k: int = typer.Option(5, "--k", help="Results to show."),
    retriever: RetrieverOpt = "hybrid",
    role: str = typer.Option(None, "--role", help="Recall only: comma list of roles."),
    since: str = typer.Option(None, "--since", help="Recall only: earliest date YYYY-MM-DD."),
    until: str = typer.Option(None, "--until", help="Recall only: latest date (inclusive)."),
    tag: str = typer.Option(None, "--tag", help="Archival only: comma list of required tags."),
    agent: str = typer.Option("default", "--agent", help="Agent whose memory to search."),
    as_json: JsonOpt = False,
) -> None:
    """Search recall memory (every message) or archival memory (passages)."""
    from ctxlab.memory.archival import ArchivalMemory
    from ctxlab.memory.embed import WordLlamaEmbedder
    from ctxlab.memory.recall import RecallMemory
    from ctxlab.memory.search import check_retriever
    from ctxlab.memory.store import open_store
    from ctxlab.rag.readers import check_date

    check_retriever(retriever)
    if not query.strip():
        raise CtxlabError("the query is empty; give words to search for.")
    if k < 1:
        raise CtxlabError(f"--k must be at least 1, got {k}.")
    if tier not in ("recall", "archival"):
        raise CtxlabError(f"--tier {tier!r} is unknown; use recall or archival.")
    for flag, value in (("--since", since), ("--until", until)):
        if value:
            check_date(value, flag)
    with open_store(db, must_exist=True, write=False) as store:
        if tier == "recall":
            roles = parse_list(role, "--role") if role else None
            hits = RecallMemory(store, WordLlamaEmbedder(), agent).search(
                query, k, retriever, roles, None, since, until
            )
            rows = [
                {"id": m.id, "date": m.created_at, "role": m.role, "text": m.content} for m in hits
            ]
        else:
            tags = parse_list(tag, "--tag") if tag else ()
            found = ArchivalMemory(store, WordLlamaEmbedder(), agent).search(
                query, k, retriever, tags
            )
            rows = [
                {"id": p.id, "date": p.created_at, "tags": list(p.tags), "text": p.text}
                for p in found
            ]
    if as_json:
        typer.echo(dumps(rows))
        return
    if not rows:
        typer.echo("no matches")
    for r in rows:
        who = r.get("role") or ",".join(r.get("tags", []))
        typer.echo(f"[{r['id']}] {r['date']} {who}: {r['text']}")


@memory_app.command("core")
def core(
    set_: str = typer.Option(None, "--set", help="LABEL=TEXT: create or overwrite a block."),
    limit: int = typer.Option(2000, "--limit", help="Character limit of the block set."),
    read_only: bool = typer.Option(False, "--read-only", help="Make the block set read-only."),
    db: DbOpt = None,
    agent: str = typer.Option("default", "--agent", help="Agent whose core memory to use."),
    as_json: JsonOpt = False,
) -> None:
    """Show core memory blocks, or set one with --set LABEL=TEXT."""
    from dataclasses import asdict

    from ctxlab.memory.core import CoreMemory
    from ctxlab.memory.store import open_store

    with open_store(db, must_exist=set_ is None, write=set_ is not None) as store:
        memory = CoreMemory(store, agent)
        if set_ is not None:
            if "=" not in set_:
                raise CtxlabError("--set needs LABEL=TEXT, e.g. --set human='Name: Ada'.")
            label, value = set_.split("=", 1)
            memory.set(label.strip(), value, limit, read_only)
        blocks = memory.blocks()
    if as_json:
        typer.echo(dumps([asdict(b) for b in blocks]))
        return
    if not blocks:
        typer.echo("no core memory blocks")
    for b in blocks:
        flag = ", read-only" if b.read_only else ""
        typer.echo(f"<{b.label}> ({len(b.value)}/{b.limit} chars{flag})\n{b.value}")


@memory_app.command("tools")
def tools() -> None:
    """Print the OpenAI tool schemas of the memory tools (Letta's names and arguments)."""
    from ctxlab.memory.tools import TOOL_SCHEMAS

    typer.echo(dumps(TOOL_SCHEMAS, indent=1))


@memory_app.command("strategies")
def strategies(as_json: JsonOpt = False) -> None:
    """List the context strategies."""
    from ctxlab.memory.strategies import DESCRIPTIONS

    if as_json:
        typer.echo(dumps(DESCRIPTIONS))
        return
    for name, text in DESCRIPTIONS.items():
        typer.echo(f"{name:20} {text}")


def register(app: typer.Typer) -> None:
    app.add_typer(memory_app, name="memory")
