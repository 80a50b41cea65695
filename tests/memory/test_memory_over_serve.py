"""The memory layer over a real OpenAI-compatible server (`ctxlab serve` in this process)
agrees with the same engine used in-process: exact token counts from the server's usage
report, the same greedy reply, and compaction's loss report on the same facts."""

from __future__ import annotations

import pytest

from ctxlab.engine import LLM
from ctxlab.memory import MemoryConfig, compaction_report, conversation_fixture
from ctxlab.memory.context import assemble
from ctxlab.memory.engine_backend import EngineBackend
from ctxlab.memory.openai_backend import OpenAIChatBackend
from tests.serve.conftest import in_process

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def fixture():
    return conversation_fixture(seed=3, sessions=2, turns_per_session=4, facts=3)


def test_counts_and_replies_match_the_in_process_engine(loaded, fixture):
    llm = LLM(loaded, kv_pool_tokens=4096)
    local = EngineBackend(llm)
    chat = assemble("You are a helpful assistant.", "", "", fixture.history[:6])
    with in_process(llm.engine, model_name="m") as url:
        remote = OpenAIChatBackend(f"{url}/v1", model="m", context_window=2048)
        assert remote.count_tokens(chat) == local.count_tokens(chat)
        assert remote.count_method == "server usage (max_tokens=1)"  # no /tokenize here
        (far,) = remote.generate([chat], 12)
    (near,) = local.generate([chat], 12)
    assert far.text == near.text and far.prompt_tokens == near.prompt_tokens


def test_the_loss_report_is_the_same_through_the_server(loaded, fixture):
    llm = LLM(loaded, kv_pool_tokens=8192)
    config = MemoryConfig(window=256, reserve=32)
    near = compaction_report(
        fixture.history, fixture.facts, "truncation", EngineBackend(llm), config
    )
    with in_process(llm.engine, model_name="m") as url:
        remote = OpenAIChatBackend(f"{url}/v1", model="m", context_window=256)
        far = compaction_report(fixture.history, fixture.facts, "truncation", remote, config)
    assert near.compactions > 0 and far.compactions == near.compactions
    assert [f.status for f in far.facts] == [f.status for f in near.facts]
    assert far.tokens_after == near.tokens_after
    assert [f.prediction for f in far.facts] == [f.prediction for f in near.facts]
