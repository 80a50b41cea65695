"""The backend demonstrations 5 and 6 give the memory and retrieval layers: the run's engine.

`WorkshopBackend` is `ctxlab.memory.EngineBackend` over an engine built on the run's shared
model, with two additions the demonstrations need:

- a batch whose chats share a long prefix (every question about one compacted conversation
  shares its whole context) has that prefix prefilled alone first, so the batch finds it in
  the prefix cache. The engine looks a prefix up only among blocks already computed, so
  requests admitted together would each compute their own copy; one request of one token
  makes them share it. The replies do not change; the prefill work does.
- every call is recorded (chats in, prompt, reused and output tokens), so a demonstration
  can say how many model calls and tokens a strategy spent, how much of the prompts the
  prefix cache served, and read the prompts it asked with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ctxlab.memory.backend import Chat, Reply
from ctxlab.memory.engine_backend import EngineBackend

if TYPE_CHECKING:
    from ctxlab.engine import LLM
    from ctxlab.workshop.server_backend import ServerLLM


@dataclass
class Call:
    chats: list[list[dict[str, str]]]
    max_tokens: int
    prompt_tokens: int
    output_tokens: int
    reused_tokens: int  # prompt tokens the prefix cache served


@dataclass
class CallLog:
    calls: list[Call] = field(default_factory=list)
    warmed_tokens: int = 0  # shared-prefix tokens prefilled ahead of their batch

    def clear(self) -> None:
        self.calls.clear()
        self.warmed_tokens = 0


class WorkshopBackend(EngineBackend):
    """An `EngineBackend` over `llm` that warms shared prefixes and logs every call."""

    def __init__(self, llm: LLM | ServerLLM, context_window: int, min_shared_tokens: int) -> None:
        super().__init__(llm, context_window=context_window)
        self.min_shared_tokens = min_shared_tokens
        self.log = CallLog()

    def generate(self, chats: Sequence[Chat], max_tokens: int) -> list[Reply]:
        from ctxlab.engine import SamplingParams

        if len(chats) > 1:
            self._warm(chats)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        outs = self.llm.generate([list(c) for c in chats], params)
        replies = [Reply(o.text.strip(), len(o.prompt_token_ids), len(o.token_ids)) for o in outs]
        self.log.calls.append(
            Call(
                [list(c) for c in chats],
                max_tokens,
                sum(r.prompt_tokens for r in replies),
                sum(r.output_tokens for r in replies),
                sum(o.metrics.reused_tokens for o in outs),
            )
        )
        return replies

    def _warm(self, chats: Sequence[Chat]) -> None:
        from ctxlab.engine import SamplingParams

        ids = [self.tokenizer.apply_chat(list(c), add_generation_prompt=True) for c in chats]
        shared = _common_prefix(ids)
        if shared >= self.min_shared_tokens:
            self.llm.generate([ids[0][:shared]], SamplingParams(max_tokens=1))
            self.log.warmed_tokens += shared


def _common_prefix(ids: Sequence[Sequence[int]]) -> int:
    first, n = ids[0], min(len(x) for x in ids)
    for i in range(n):
        if any(x[i] != first[i] for x in ids[1:]):
            return i
    return n
