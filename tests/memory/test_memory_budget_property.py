"""The prompt never exceeds the budget, counted with the default model's own tokenizer and
chat template, whatever the message lengths, budget and strategy (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxlab.errors import CtxlabError
from ctxlab.memory.agent import MemoryAgent
from ctxlab.memory.backend import Reply
from ctxlab.memory.budget import MemoryConfig
from ctxlab.memory.context import assemble
from ctxlab.memory.messages import Message
from ctxlab.memory.store import open_store

pytestmark = pytest.mark.model

WORDS = "the cat sat on 4417 a mat Pemberly quietly near QX2208 river, stone. ok".split()


class RealCountFakeReply:
    """Counts with the real tokenizer; 'summarises' by echoing the last words it was given."""

    name = "real-count"

    def __init__(self, real) -> None:
        self.real = real

    @property
    def context_window(self) -> int:
        return self.real.context_window

    def count_tokens(self, chat):
        return self.real.count_tokens(chat)

    def generate(self, chats, max_tokens):
        out = []
        for chat in chats:
            words = chat[-1]["content"].split()[-max_tokens // 2 :]
            out.append(Reply(" ".join(words), 0, len(words)))
        return out

    def measure_prefill(self, chat):
        return None


counter = itertools.count()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=120), min_size=1, max_size=24),
    window=st.integers(min_value=96, max_value=900),
    reserve=st.integers(min_value=0, max_value=64),
    strategy=st.sampled_from(["truncation", "summary", "summary-extractive", "tiered"]),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_prompt_never_exceeds_the_budget(
    real_backend, tmp_path_factory, lengths, window, reserve, strategy, seed
):
    backend = RealCountFakeReply(real_backend)
    cfg = MemoryConfig(window=window, reserve=reserve, retrieve_k=3)
    path = tmp_path_factory.mktemp("budget") / f"{next(counter)}.db"
    with open_store(path) as store:
        agent = MemoryAgent(backend, strategy, store, cfg, embedder=None, retriever="bm25")
        for i, n in enumerate(lengths):
            words = [WORDS[(seed + i * 7 + j) % len(WORDS)] for j in range(n)]
            role = "user" if i % 2 == 0 else "assistant"
            message = Message(role, " ".join(words))
            try:
                agent.observe(message)
            except CtxlabError as exc:
                assert "the newest turn alone needs" in str(exc)
                kept = agent.state.messages
                start = max((j for j, m in enumerate(kept) if m.role == "user"), default=0)
                turn = [*kept[start:], message] if role == "assistant" else [message]
                bare = assemble(cfg.system_prompt, "", "", turn)
                assert real_backend.count_tokens(bare) > cfg.budget  # it really cannot fit
                continue
            assert real_backend.count_tokens(agent.chat()) <= cfg.budget
        try:
            chat = agent.preview("What was the number near the river?")
        except CtxlabError:
            return
        assert real_backend.count_tokens(chat) <= cfg.budget
