"""Where a demonstration's requests go: the run's engine or a user's server, chosen once per
run (`Session.requests`).

A demonstration that declares `ServerMode(through=True)` sends its requests through
`session.requests`: `generator()` gives something that answers `generate` as the in-process
`LLM` does (the `LLM` itself, or a `ServerLLM`), `chat(...)` the memory and retrieval layers'
backend (`WorkshopBackend` over a fresh engine, or the server's chat API), and
`slot_bytes(...)` the bytes of one token slot (read from the engine's pool; through a server,
whose pool is not visible, the planner's figure for the local model). A demonstration that
needs the engine itself (its pool, its page size, its steps) builds one with `session.llm`,
and runs on the local engine whatever the backend is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ctxlab.arch.spec import ArchSpec
    from ctxlab.engine import LLM, SamplingParams
    from ctxlab.engine.metrics import RequestMetrics
    from ctxlab.memory.backend import Chat, Reply
    from ctxlab.workshop.config import CommonConfig
    from ctxlab.workshop.memory_backend import CallLog
    from ctxlab.workshop.server_backend import ServerLLM, ServerMetrics
    from ctxlab.workshop.server_chat import ServerChatBackend


class Output(Protocol):
    """One finished request, as `LLM.generate` and `ServerLLM.generate` return it."""

    @property
    def prompt_token_ids(self) -> list[int]: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def text(self) -> str: ...
    @property
    def metrics(self) -> RequestMetrics | ServerMetrics: ...


class Generator(Protocol):
    def generate(
        self,
        prompts: Sequence[list[int]] | Sequence[list[dict[str, str]]],
        params: SamplingParams | None = None,
        cache_salt: str | None = None,
    ) -> Sequence[Output]: ...


class ChatBackend(Protocol):
    """The memory and retrieval layers' backend, with the workshop's call log."""

    log: CallLog
    context_window: int

    def count_tokens(self, chat: Chat) -> int: ...
    def generate(self, chats: Sequence[Chat], max_tokens: int) -> list[Reply]: ...


class LocalEngines(Protocol):
    """What the backends need of the run's session (`Session` answers it): engines over the
    shared model, a pool's bytes per token slot, and the planner's view of the model."""

    cfg: CommonConfig

    def llm(
        self,
        page_size: int | None = None,
        pool_tokens: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        prefix_caching: bool = True,
        warm_up: bool = True,
    ) -> LLM: ...
    def slot_bytes(self, llm: LLM) -> int: ...
    def arch(self) -> ArchSpec: ...


class RequestBackend(Protocol):
    label: str  # where the requests went, for table titles ("" on the local engine)

    def generator(self) -> Generator: ...
    def chat(self, pool_tokens: int, max_num_seqs: int) -> ChatBackend: ...
    def slot_bytes(self, generator: Generator) -> int: ...


@dataclass
class EngineRequests:
    """The local engine: a fresh one per call, on the run's shared model."""

    session: LocalEngines
    label: str = ""

    def generator(self) -> LLM:
        return self.session.llm()

    def chat(self, pool_tokens: int, max_num_seqs: int) -> ChatBackend:
        """A fresh engine with `pool_tokens` (whole pages) and `max_num_seqs` sized by the
        demonstration for its largest batch (a shared prefix is warmed when it fills at
        least one page)."""
        from ctxlab.workshop.memory_backend import WorkshopBackend

        s = self.session
        page = s.cfg.engine.page_size
        pool = -(-pool_tokens // page) * page
        llm = s.llm(pool_tokens=pool, max_num_seqs=max_num_seqs)
        return WorkshopBackend(llm, s.cfg.model.max_model_len, page)

    def slot_bytes(self, generator: Generator) -> int:
        return self.session.slot_bytes(generator)  # type: ignore[arg-type]


@dataclass
class ServerRequests:
    """A user's server: token-id prompts to `/v1/completions`, chats to its chat API (set
    only once its token counts matched the local tokenizer's)."""

    session: LocalEngines
    server: ServerLLM
    chat_api: ServerChatBackend | None
    label: str = ""

    def __post_init__(self) -> None:
        self.label = self.server.label(code=True)

    def generator(self) -> ServerLLM:
        return self.server

    def chat(self, pool_tokens: int, max_num_seqs: int) -> ChatBackend:
        if self.chat_api is None:  # the runner marks such demonstrations not measurable
            raise RuntimeError("the server's chat API was not checked for this run")
        return self.chat_api

    def slot_bytes(self, generator: Generator) -> int:
        return self.session.arch().kv_bytes_per_token()
