"""The compaction loss report: what a strategy kept, what search can still find, what is gone.

A history is replayed through a `MemoryAgent` under a budget. Then, for every planted fact:
`in_context` when its answer is still in the compacted prompt; else `recoverable` when a
recall-memory search for its question returns the message that states it (top `search_k`);
else `lost`. Each fact's question is then asked with the compacted context (the strategy's
own retrieval included), so a strategy is judged by the answers it still supports, not by
the tokens it saved.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ctxlab import stats
from ctxlab.memory.agent import MemoryAgent
from ctxlab.memory.backend import Backend
from ctxlab.memory.budget import MemoryConfig, PressureEvent
from ctxlab.memory.context import assemble, context_text
from ctxlab.memory.embed import Embedder, WordLlamaEmbedder
from ctxlab.memory.fixtures import Fact
from ctxlab.memory.messages import Message
from ctxlab.memory.scoring import answer_match, normalize
from ctxlab.memory.store import open_store
from ctxlab.memory.strategies import Strategy, make_strategy

STATUSES = ("in_context", "recoverable", "lost")


@dataclass(frozen=True)
class FactOutcome:
    id: str
    question: str
    answer: str
    status: str  # in_context | recoverable | lost
    search_rank: int | None  # rank of the stating message in the recall search (1-based)
    prediction: str
    correct: bool


@dataclass
class CompactionReport:
    strategy: str
    window: int
    reserve: int
    messages: int
    tokens_before: int  # the whole history as one prompt
    tokens_after: int  # the compacted prompt
    compactions: int
    warnings: int
    evicted: int
    search_k: int
    retriever: str
    facts: list[FactOutcome] = field(default_factory=list)
    note_position: str = "system"
    keeps_log: bool = True  # False: the strategy deleted what it evicted from the log
    note: str = ""  # the strategy's note at the end: the summary or the recall note
    events: list[PressureEvent] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(f.status == status for f in self.facts)

    def lost_facts(self) -> list[str]:
        """Ids of the facts that cannot be reconstructed: not in context, not found by search."""
        return [f.id for f in self.facts if f.status == "lost"]

    @property
    def accuracy(self) -> float:
        return sum(f.correct for f in self.facts) / len(self.facts) if self.facts else 0.0

    def summary(self) -> dict[str, object]:
        """One row of the compaction table; facts kept and answers right with their Wilson
        95 % intervals (`ctxlab.stats`)."""
        kept = self.count("in_context") + self.count("recoverable")
        kept_ci = stats.wilson(kept, len(self.facts))
        right = stats.proportion([f.correct for f in self.facts])
        return {
            "strategy": self.strategy,
            "note_position": self.note_position,
            "keeps_log": self.keeps_log,
            "facts": len(self.facts),
            "in_context": self.count("in_context"),
            "recoverable": self.count("recoverable"),
            "lost": self.count("lost"),
            "kept": kept,
            "kept_low": kept_ci.low,
            "kept_high": kept_ci.high,
            "accuracy": self.accuracy,
            "accuracy_low": right.low,
            "accuracy_high": right.high,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "compactions": self.compactions,
            "evicted_messages": self.evicted,
        }

    def as_dict(self) -> dict[str, object]:
        return {
            **self.summary(),
            "window": self.window,
            "reserve": self.reserve,
            "messages": self.messages,
            "warnings": self.warnings,
            "search_k": self.search_k,
            "retriever": self.retriever,
            "note": self.note,
            "lost_facts": self.lost_facts(),
            "per_fact": [asdict(f) for f in self.facts],
            "events": [asdict(e) for e in self.events],
        }


def model_ceiling(
    history: Sequence[Message],
    facts: Sequence[Fact],
    backend: Backend,
    config: MemoryConfig | None = None,
    answer_tokens: int = 24,
) -> float:
    """Accuracy when each question sees only the message stating its fact: the model's limit.

    No strategy can beat this with the same model, so it separates what a strategy lost
    from what the model cannot do with a fact in plain view.
    """
    cfg = config or MemoryConfig(window=backend.context_window)
    chats = [
        assemble(cfg.system_prompt, "", "", [history[f.message], Message("user", f.question)])
        for f in facts
    ]
    replies = backend.generate(chats, answer_tokens) if chats else []
    hits = [answer_match(r.text, [f.answer]) for f, r in zip(facts, replies, strict=True)]
    return sum(hits) / len(hits) if hits else 0.0


def compaction_report(
    history: Sequence[Message],
    facts: Sequence[Fact],
    strategy: str | Strategy,
    backend: Backend,
    config: MemoryConfig | None = None,
    search_k: int = 3,
    retriever: str = "hybrid",
    answer_tokens: int = 24,
    embedder: Embedder | None = None,
    db: str | Path | None = None,
    on_step: Callable[[str], None] | None = None,
) -> CompactionReport:
    """Replay `history` under `strategy`, classify every fact, answer every fact's question.

    `db` keeps the replay's store (a temporary one is used and deleted otherwise).
    """
    strat = make_strategy(strategy) if isinstance(strategy, str) else strategy
    cfg = config or MemoryConfig(window=backend.context_window)
    emb = embedder if embedder is not None else WordLlamaEmbedder()
    with tempfile.TemporaryDirectory(prefix="ctxlab-compact-") as tmp:
        path = Path(db) if db is not None else Path(tmp) / "replay.db"
        with open_store(path) as store:
            agent = MemoryAgent(
                backend,
                strat,
                store,
                cfg,
                agent=f"compact-{strat.name}",
                embedder=emb,
                retriever=retriever,
            )
            full = assemble(cfg.system_prompt, agent.core.render(), "", history)
            tokens_before = backend.count_tokens(full)
            if on_step:
                on_step(f"{strat.name}: replaying {len(history)} messages")
            agent.observe(history)
            compacted = agent.chat()
            tokens_after = backend.count_tokens(compacted)
            text = f" {normalize(context_text(compacted))} "
            statuses: list[tuple[str, int | None]] = []
            for fact in facts:
                hits = agent.recall.search(fact.question, search_k, retriever)
                target = agent.ids[fact.message]
                rank = next((r + 1 for r, m in enumerate(hits) if m.id == target), None)
                if f" {normalize(fact.answer)} " in text:
                    statuses.append(("in_context", rank))
                elif rank is not None:
                    statuses.append(("recoverable", rank))
                else:
                    statuses.append(("lost", rank))
            if on_step:
                on_step(f"{strat.name}: answering {len(facts)} questions")
            chats = [agent.preview(f.question) for f in facts]
            replies = backend.generate(chats, answer_tokens) if chats else []
            outcomes = [
                FactOutcome(
                    f.id,
                    f.question,
                    f.answer,
                    status,
                    rank,
                    reply.text,
                    answer_match(reply.text, [f.answer]),
                )
                for f, (status, rank), reply in zip(facts, statuses, replies, strict=True)
            ]
            events = list(agent.events)
            note = agent.state.note
    return CompactionReport(
        strategy=strat.name,
        window=cfg.window,
        reserve=cfg.reserve,
        messages=len(history),
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        compactions=sum(e.kind == "compaction" for e in events),
        warnings=sum(e.kind == "warning" for e in events),
        evicted=sum(e.evicted for e in events),
        search_k=search_k,
        retriever=retriever,
        note_position=cfg.note_position,
        keeps_log=strat.keeps_log,
        note=note,
        facts=outcomes,
        events=events,
    )
