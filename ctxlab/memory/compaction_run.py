"""A compaction comparison (`ctxlab memory compact`): its settings, checked in one place, and
the run.

`CompactionSettings` holds everything the comparison is given besides the conversation and
the backend: the memory budget (`MemoryConfig`, which checks the window, reserve, shares and
note position), the strategies, the recall retriever, the answer length, and the positions
of the backend's model when known. A bad value is one sentence when the settings are built,
before a model loads. `run_compaction` replays the history under each strategy, beside the
model's ceiling, and writes `compaction.json` and `compaction.png`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.memory.backend import Backend
from ctxlab.memory.budget import MemoryConfig
from ctxlab.memory.fixtures import Fact
from ctxlab.memory.loss import CompactionReport, compaction_report, model_ceiling
from ctxlab.memory.messages import Message
from ctxlab.memory.search import check_retriever
from ctxlab.memory.strategies import make_strategy
from ctxlab.progress import progress

LOOP = "deterministic (the default model cannot call tools)"


@dataclass(frozen=True)
class CompactionSettings:
    """What a compaction comparison runs with; checked when built (see the module doc)."""

    memory: MemoryConfig
    strategies: tuple[str, ...]
    retriever: str = "hybrid"
    answer_tokens: int = 16
    model_positions: int | None = None  # the backend model's positions (None: unknown)

    def __post_init__(self) -> None:
        for name in self.strategies:
            make_strategy(name)
        check_retriever(self.retriever)
        if self.memory.retrieve_k < 1 or self.answer_tokens < 1:
            raise CtxlabError("--k and --answer-tokens must be at least 1.")
        if self.answer_tokens > self.memory.reserve:
            raise CtxlabError(
                f"--answer-tokens {self.answer_tokens} exceeds --reserve {self.memory.reserve}."
            )
        limit, window = self.model_positions, self.memory.window
        if limit is not None and window > limit:
            raise CtxlabError(
                f"--window {window:,} is beyond the model's {limit:,} positions; "
                f"give at most {limit:,}."
            )


@dataclass(frozen=True)
class CompactionRun:
    """The comparison's document (what `compaction.json` holds), its reports and files."""

    doc: dict[str, object]
    reports: list[CompactionReport]
    files: tuple[Path, Path]  # compaction.json, compaction.png


def run_compaction(
    settings: CompactionSettings,
    messages: Sequence[Message],
    facts: Sequence[Fact],
    backend: Backend,
    source: str,
    folder: Path,
) -> CompactionRun:
    """Replay `messages` under each strategy and report every planted fact (progress shown);
    `source` names where the conversation came from."""
    config, k = settings.memory, settings.memory.retrieve_k
    reports = []
    with progress("model ceiling (each fact's own message only)"):
        ceiling = model_ceiling(messages, facts, backend, config, settings.answer_tokens)
    with progress("compaction", len(settings.strategies)) as bar:
        for name in settings.strategies:
            bar.describe(f"compaction: {name}")
            reports.append(
                compaction_report(
                    messages,
                    facts,
                    name,
                    backend,
                    config,
                    search_k=k,
                    retriever=settings.retriever,
                    answer_tokens=settings.answer_tokens,
                    on_step=bar.describe,
                )
            )
            bar.advance()
    doc: dict[str, object] = {
        "source": source,
        "model": getattr(backend, "model_label", backend.name),
        "window": config.window,
        "reserve": config.reserve,
        "search_k": k,
        "retriever": settings.retriever,
        "note_position": config.note_position,
        "loop": LOOP,
        "model_ceiling": ceiling,
        "compaction": [r.summary() for r in reports],
        "reports": [r.as_dict() for r in reports],
    }
    report, plot = folder / "compaction.json", folder / "compaction.png"
    report.write_text(json.dumps(doc, indent=1) + "\n")
    from ctxlab.memory.plot import plot_compaction

    plot_compaction(reports, ceiling, plot)
    return CompactionRun(doc, reports, (report, plot))
