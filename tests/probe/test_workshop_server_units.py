"""The pieces of `ctxlab workshop --server` that need no model: demonstration 4's sizing
from a probed capacity, and demonstrations 5 and 6's chat backend (the server's chat API,
with the local tokenizer's counts checked against the server's)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from ctxlab.probe.client import Budget, ProbeClient
from ctxlab.probe.figures import Figure
from ctxlab.workshop.config_file import load_config
from ctxlab.workshop.server_eviction import kept_by, size
from tests.probe.conftest import Script, stand_in


def _session(**eviction):
    cfg = load_config(quick=True)
    ev = cfg.eviction.model_copy(update=eviction)
    return SimpleNamespace(cfg=cfg.model_copy(update={"eviction": ev}))


def test_capacity_figures_read_as_tokens_or_prompts():
    assert kept_by(Figure("c", 1024, "measured")) == ("tokens", 1024)
    assert kept_by(Figure("c", "2 prompts", "inferred")) == ("prompts", 2)
    assert kept_by(Figure("c", "1,152-1,280", "inferred")) == ("tokens", 1280)
    lower = kept_by(Figure("c", 4224, "inferred", "a lower bound"))
    assert isinstance(lower, str) and "could not bound" in lower


@pytest.mark.parametrize("kept", [1024, 4096, 20_000])
def test_paged_prefixes_overflow_the_cache_by_pool_share(kept):
    session = _session()
    ev = session.cfg.eviction
    s = size(session, 16, Figure("c", kept, "measured"), 4096)
    assert not isinstance(s, str)
    assert s.prefix_tokens % 16 == 0 and s.prefix_tokens + ev.suffix_tokens < 4096
    working = s.groups * s.prefix_tokens
    # the cache holds about pool_share of the prefixes (rounded up to whole pages), < 1
    assert kept / working <= ev.pool_share + 1e-9
    assert kept / working > ev.pool_share * 0.9
    assert s.sim_pool_tokens == kept


def test_slot_caches_get_more_groups_than_prompts_kept():
    session = _session(groups=2)
    s = size(session, 1, Figure("c", "3 prompts", "inferred"), 2048)
    assert not isinstance(s, str)
    assert s.kind == "prompts" and s.groups == 5  # 3 kept + 2: interleaving evicts
    req = s.prefix_tokens + session.cfg.eviction.suffix_tokens + session.cfg.eviction.output_tokens
    assert s.sim_pool_tokens == 3 * (req + 1)


def test_a_cache_too_large_to_overflow_is_not_measurable():
    why = size(_session(), 16, Figure("c", 10**7, "measured"), 4096)
    assert isinstance(why, str) and "more than the workshop's" in why


@dataclass
class _Tok:
    def apply_chat(self, chat, add_generation_prompt=True):
        return [1] * sum(len(m["content"].split()) for m in chat)


def _backend(url: str):
    from ctxlab.probe.identify import ServerInfo
    from ctxlab.workshop.server_chat import ServerChatBackend

    client = ProbeClient(url, "m", None, Budget(100, 10**6))
    info = ServerInfo(url, "m", ["m"], "unknown", "", 2048)
    server = SimpleNamespace(client=client, info=info, label=lambda code=False: url)
    return ServerChatBackend(server, _Tok(), 2048, 4)


def test_chat_backend_sends_chats_and_logs_reuse():
    script = Script()
    with stand_in(script) as url:
        b = _backend(url)
        assert b.check_counts() is None
        shared = [{"role": "system", "content": "one two three four five six"}]
        chats = [[*shared, {"role": "user", "content": f"question {i}"}] for i in range(3)]
        replies = b.generate(chats, 4)
    assert [r.text for r in replies] == ["x", "x", "x"]
    assert script.paths == ["/v1/chat/completions"] * 4  # the check, then the three chats
    (call,) = b.log.calls
    assert call.prompt_tokens == 3 * 8 and call.reused_tokens == 3 * 4
    assert b.count_tokens(chats[0]) == 8  # the local tokenizer, no request


def test_chat_backend_refuses_a_server_that_counts_differently():
    with stand_in(Script(chat_prompt_tokens=99)) as url:
        why = _backend(url).check_counts()
    assert why is not None and "counts 99 prompt tokens" in why
