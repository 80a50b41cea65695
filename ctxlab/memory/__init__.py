"""Application memory: tiered memory, context strategies and compaction loss reports.

Public API (plain dataclasses, no torch at import):

- `open_store(path)` -> `Store`: the SQLite file (WAL, FTS5) holding every tier.
- `MemoryAgent(backend, strategy, store, MemoryConfig(window=...))`: the memory loop
  (`observe`, `prepare`, `respond`), with `core`, `recall` and `archival` tiers.
- `compaction_report(history, facts, strategy, backend, config)` -> `CompactionReport`;
  `model_ceiling(history, facts, backend)`: accuracy with only each fact's own message.
- `conversation_fixture(seed)` -> history and planted facts; `STRATEGIES` by name.
- `EngineBackend` (in-process engine) and `OpenAIChatBackend` (any compatible server).
- `MemoryTools`: Letta-style tools with OpenAI schemas (`TOOL_SCHEMAS`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxlab.lazy import lazy_attributes

# Names resolve on first use, so `from ctxlab.memory.search import ...` (what `rag ask`
# needs) does not import the agent, strategies, numpy and the rest of the package.
_WHERE = {
    "LOOP_NOTE": "ctxlab.memory.agent",
    "MemoryAgent": "ctxlab.memory.agent",
    "ArchivalMemory": "ctxlab.memory.archival",
    "Passage": "ctxlab.memory.archival",
    "Backend": "ctxlab.memory.backend",
    "Reply": "ctxlab.memory.backend",
    "MemoryConfig": "ctxlab.memory.budget",
    "PressureEvent": "ctxlab.memory.budget",
    "Block": "ctxlab.memory.core",
    "CoreMemory": "ctxlab.memory.core",
    "MemoryEditError": "ctxlab.memory.core",
    "WordLlamaEmbedder": "ctxlab.memory.embed",
    "EngineBackend": "ctxlab.memory.engine_backend",
    "ConversationFixture": "ctxlab.memory.fixtures",
    "Fact": "ctxlab.memory.fixtures",
    "conversation_fixture": "ctxlab.memory.fixtures",
    "CompactionReport": "ctxlab.memory.loss",
    "FactOutcome": "ctxlab.memory.loss",
    "compaction_report": "ctxlab.memory.loss",
    "model_ceiling": "ctxlab.memory.loss",
    "Message": "ctxlab.memory.messages",
    "read_history": "ctxlab.memory.messages",
    "OpenAIChatBackend": "ctxlab.memory.openai_backend",
    "RecallMemory": "ctxlab.memory.recall",
    "answer_match": "ctxlab.memory.scoring",
    "normalize": "ctxlab.memory.scoring",
    "Store": "ctxlab.memory.store",
    "default_db_path": "ctxlab.memory.store",
    "open_store": "ctxlab.memory.store",
    "DESCRIPTIONS": "ctxlab.memory.strategies",
    "STRATEGIES": "ctxlab.memory.strategies",
    "Strategy": "ctxlab.memory.strategies",
    "make_strategy": "ctxlab.memory.strategies",
}

if TYPE_CHECKING:
    from ctxlab.memory.agent import LOOP_NOTE, MemoryAgent
    from ctxlab.memory.archival import ArchivalMemory, Passage
    from ctxlab.memory.backend import Backend, Reply
    from ctxlab.memory.budget import MemoryConfig, PressureEvent
    from ctxlab.memory.core import Block, CoreMemory, MemoryEditError
    from ctxlab.memory.embed import WordLlamaEmbedder
    from ctxlab.memory.engine_backend import EngineBackend
    from ctxlab.memory.fixtures import ConversationFixture, Fact, conversation_fixture
    from ctxlab.memory.loss import CompactionReport, FactOutcome, compaction_report, model_ceiling
    from ctxlab.memory.messages import Message, read_history
    from ctxlab.memory.openai_backend import OpenAIChatBackend
    from ctxlab.memory.recall import RecallMemory
    from ctxlab.memory.scoring import answer_match, normalize
    from ctxlab.memory.store import Store, default_db_path, open_store
    from ctxlab.memory.strategies import DESCRIPTIONS, STRATEGIES, Strategy, make_strategy


__getattr__ = lazy_attributes(__name__, _WHERE, globals())


__all__ = [
    "DESCRIPTIONS",
    "LOOP_NOTE",
    "STRATEGIES",
    "ArchivalMemory",
    "Backend",
    "Block",
    "CompactionReport",
    "ConversationFixture",
    "CoreMemory",
    "EngineBackend",
    "Fact",
    "FactOutcome",
    "MemoryAgent",
    "MemoryConfig",
    "MemoryEditError",
    "Message",
    "OpenAIChatBackend",
    "Passage",
    "PressureEvent",
    "RecallMemory",
    "Reply",
    "Store",
    "Strategy",
    "WordLlamaEmbedder",
    "answer_match",
    "compaction_report",
    "conversation_fixture",
    "default_db_path",
    "make_strategy",
    "model_ceiling",
    "normalize",
    "open_store",
    "read_history",
]
