"""The memory loop: store every message, watch the pressure, compact, and build each prompt.

`MemoryAgent` owns one conversation's context. Every message goes to recall memory first
(the record survives whatever the strategy does). After each message the prompt is counted
exactly with the backend; past the warning share a warning is recorded, past the
compaction share the oldest turns are evicted (see `eviction.py`) and handed to the
strategy. Before a reply the strategy may bring messages back for the user's turn, only as
many as fit. The assembled prompt never exceeds the budget; when even the newest turn does
not fit, that is a CtxlabError naming the numbers.

This loop is deterministic and tool-free because the default model cannot call tools; a
tool-calling model can drive the same memory through `tools.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxlab.errors import CtxlabError
from ctxlab.memory.archival import ArchivalMemory
from ctxlab.memory.backend import Backend, Reply
from ctxlab.memory.budget import MemoryConfig, PressureEvent
from ctxlab.memory.context import ContextState, assemble
from ctxlab.memory.core import CoreMemory
from ctxlab.memory.embed import Embedder
from ctxlab.memory.eviction import choose_cut
from ctxlab.memory.messages import Message
from ctxlab.memory.recall import RecallMemory
from ctxlab.memory.store import Store
from ctxlab.memory.strategies import Strategy, StrategyEnv, make_strategy

LOOP_NOTE = (
    "deterministic loop (no tool calls: the default model cannot call tools): evicted "
    "messages are archived to recall memory and the user's turn retrieves them"
)


class MemoryAgent:
    def __init__(
        self,
        backend: Backend,
        strategy: Strategy | str,
        store: Store,
        config: MemoryConfig | None = None,
        agent: str = "default",
        embedder: Embedder | None = None,
        retriever: str = "hybrid",
    ) -> None:
        self.backend = backend
        self.strategy = make_strategy(strategy) if isinstance(strategy, str) else strategy
        self.config = config or MemoryConfig(window=backend.context_window)
        if self.config.window > backend.context_window:
            raise CtxlabError(
                f"the window of {self.config.window} tokens exceeds the model's context "
                f"window of {backend.context_window} tokens."
            )
        self.core = CoreMemory(store, agent)
        self.recall = RecallMemory(store, embedder, agent)
        self.archival = ArchivalMemory(store, embedder, agent)
        self.env = StrategyEnv(backend, self.recall, self.config, retriever)
        self.state = ContextState()
        self.events: list[PressureEvent] = []
        self.ids: list[int] = []  # recall id of every observed message, in order
        self._seen = 0
        self._warned = False

    # -- the prompt ---------------------------------------------------------------------------
    def chat(self, state: ContextState | None = None) -> list[dict[str, str]]:
        s = self.state if state is None else state
        cfg = self.config
        return assemble(
            cfg.system_prompt,
            self.core.render(),
            s.note,
            s.messages,
            s.retrieved,
            cfg.note_position,
        )

    def tokens(self, state: ContextState | None = None) -> int:
        return self.backend.count_tokens(self.chat(state))

    # -- messages in ----------------------------------------------------------------------------
    def observe(self, messages: Message | Sequence[Message]) -> list[PressureEvent]:
        """Record messages (one transaction), then act on the pressure after each one."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        new: list[PressureEvent] = []
        for m in self.recall.add(batch):
            self.ids.append(int(m.id or 0))
            self.state.retrieved = []  # recalled messages belong to one user turn
            self.state.messages.append(m)
            try:
                new += self._relieve(self._seen)
            except CtxlabError:
                self.state.messages.pop()  # stays in recall; the context stays within budget
                raise
            self._seen += 1
        self.events += new
        return new

    def _relieve(self, index: int) -> list[PressureEvent]:
        cfg = self.config
        tokens = self.tokens()
        share = cfg.share(tokens)
        if share >= cfg.compact_share:
            self._warned = False
            return [self._compact(index, tokens)]
        if share >= cfg.warn_share and not self._warned:
            self._warned = True
            return [PressureEvent("warning", index, tokens, tokens, share)]
        return []

    def _compact(self, index: int, tokens: int) -> PressureEvent:
        cfg = self.config
        messages = self.state.messages
        target = cfg.target_share * cfg.budget
        reserve = self.strategy.note_budget

        def fits(cut: int) -> bool:
            trial = ContextState(messages[cut:], "", [], 0)
            return self.tokens(trial) + reserve <= target

        cut, evict_share = choose_cut(messages, fits, cfg.first_evict, cfg.evict_step)
        if cut:
            evicted = messages[:cut]
            self.state.messages = messages[cut:]
            self.state.evicted_total += len(evicted)
            self.strategy.on_evict(evicted, self.state, self.env)
        after = self._enforce_budget(self.state)
        return PressureEvent(
            "compaction", index, tokens, after, cfg.share(tokens), cut, evict_share
        )

    def _enforce_budget(self, state: ContextState) -> int:
        """Make the prompt fit: drop recalled messages, then shorten the note; else fail."""
        budget = self.config.budget
        tokens = self.tokens(state)
        while tokens > budget and state.retrieved:
            state.retrieved.pop()
            tokens = self.tokens(state)
        if tokens > budget and state.note:
            words = state.note.split(" ")
            lo, hi = 0, len(words)  # the longest prefix of the note that fits
            while lo < hi:
                mid = (lo + hi + 1) // 2
                trial = ContextState(state.messages, " ".join(words[:mid]), [], 0)
                if self.tokens(trial) <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            state.note = " ".join(words[:lo])
            tokens = self.tokens(state)
        if tokens > budget:
            cfg = self.config
            raise CtxlabError(
                f"the newest turn alone needs {tokens} prompt tokens, more than the budget of "
                f"{budget} (window {cfg.window} minus reserve {cfg.reserve}); raise the window "
                "or shorten the message."
            )
        return tokens

    # -- a reply --------------------------------------------------------------------------------
    def prepare(self, state: ContextState | None = None) -> list[dict[str, str]]:
        """The prompt for the next reply: the strategy's recalled messages, as many as fit."""
        s = self.state if state is None else state
        users = [m for m in s.messages if m.role == "user"]
        s.retrieved = []
        if users:
            budget = self.config.budget
            for m in self.strategy.on_user_turn(users[-1].content, s, self.env):
                s.retrieved.append(m)
                if self.tokens(s) > budget:
                    s.retrieved.pop()
                    break
        self._enforce_budget(s)
        return self.chat(s)

    def preview(self, user_text: str) -> list[dict[str, str]]:
        """The prompt a new user turn would get, without recording it (for evaluation).

        If the question pushes the prompt over the budget, the oldest turns of the copy are
        dropped (the strategy is not run, so previewing changes nothing).
        """
        state = self.state.copy()
        state.messages.append(Message("user", user_text))
        while self.tokens(state) > self.config.budget and len(state.messages) > 1:
            cut, _ = choose_cut(state.messages, lambda c: True, 0.0, 1.0)
            if cut == 0:
                break
            state.messages = state.messages[cut:]
        return self.prepare(state)

    def respond(self, user_text: str, max_tokens: int = 64, session: str = "default") -> Reply:
        """One turn: record the user's message, reply within the budget, record the reply."""
        if max_tokens > self.config.reserve:
            raise CtxlabError(
                f"max_tokens {max_tokens} exceeds the output reserve of {self.config.reserve}."
            )
        self.observe(Message("user", user_text, session))
        reply = self.backend.generate([self.prepare()], max_tokens)[0]
        self.observe(Message("assistant", reply.text, session))
        return reply
