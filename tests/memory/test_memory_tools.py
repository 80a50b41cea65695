"""Letta-style memory tools: schemas, every tool on a real store, mistakes as 'Error:' text,
and the tool loop against a real HTTP server speaking the OpenAI chat API."""

from __future__ import annotations

import json

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.memory.archival import ArchivalMemory
from ctxlab.memory.core import CoreMemory
from ctxlab.memory.embed import WordLlamaEmbedder
from ctxlab.memory.messages import Message
from ctxlab.memory.openai_backend import OpenAIChatBackend
from ctxlab.memory.recall import RecallMemory
from ctxlab.memory.tool_loop import run_with_tools
from ctxlab.memory.tools import TOOL_NAMES, TOOL_SCHEMAS, MemoryTools


@pytest.fixture
def tools(store):
    emb = WordLlamaEmbedder()
    core = CoreMemory(store)
    core.set("human", "Name: Ada.", limit=40)
    core.set("persona", "A careful assistant.", read_only=True)
    recall = RecallMemory(store, emb)
    recall.add(
        [
            Message("user", "I water the basil every Monday.", "s1", "2024-03-04T10:00:00"),
            Message("assistant", "Basil likes morning water.", "s1", "2024-03-04T10:01:00"),
            Message("user", "My flight is QX2208.", "s2", "2024-03-11T10:00:00"),
        ]
    )
    return MemoryTools(core, ArchivalMemory(store, emb), recall, page_size=2)


def test_schemas_name_the_letta_tools():
    assert TOOL_NAMES == (
        "core_memory_append",
        "core_memory_replace",
        "archival_memory_insert",
        "archival_memory_search",
        "conversation_search",
    )
    for schema in TOOL_SCHEMAS:
        params = schema["function"]["parameters"]
        assert schema["type"] == "function" and params["type"] == "object"
        assert set(params["required"]) <= set(params["properties"])
    required = {
        s["function"]["name"]: s["function"]["parameters"]["required"] for s in TOOL_SCHEMAS
    }
    assert required["core_memory_replace"] == ["label", "old_content", "new_content"]


def test_core_memory_tools_respect_limits_and_read_only(tools):
    assert tools.call("core_memory_append", {"label": "human", "content": "Likes tea."}).startswith(
        "OK"
    )
    assert tools.core.get("human").value == "Name: Ada.\nLikes tea."
    over = tools.call("core_memory_append", {"label": "human", "content": "x" * 50})
    assert over.startswith("Error:") and "over its limit of 40" in over
    assert tools.core.get("human").value == "Name: Ada.\nLikes tea."  # unchanged
    assert "read-only" in tools.call(
        "core_memory_replace",
        {"label": "persona", "old_content": "careful", "new_content": "bold"},
    )
    missing = tools.call(
        "core_memory_replace", '{"label": "human", "old_content": "Bob", "new_content": "Eve"}'
    )
    assert "does not contain" in missing
    ok = tools.call(
        "core_memory_replace", {"label": "human", "old_content": "Ada", "new_content": "Eve"}
    )
    assert ok.startswith("OK") and tools.core.get("human").value.startswith("Name: Eve.")
    assert "no block 'pets'" in tools.call("core_memory_append", {"label": "pets", "content": "c"})


def test_archival_insert_and_search_with_tags_and_pages(tools):
    tools.call(
        "archival_memory_insert", {"content": "The cabin wifi is bluefern82.", "tags": ["home"]}
    )
    tools.call(
        "archival_memory_insert", {"content": "The office wifi is guest-net.", "tags": ["work"]}
    )
    tools.call("archival_memory_insert", {"content": "Wifi routers need a reboot.", "tags": []})
    found = json.loads(tools.call("archival_memory_search", {"query": "wifi", "tags": ["home"]}))
    assert [p["text"] for p in found] == ["The cabin wifi is bluefern82."]
    first = json.loads(tools.call("archival_memory_search", {"query": "wifi", "top_k": 2}))
    second = json.loads(
        tools.call("archival_memory_search", {"query": "wifi", "top_k": 2, "page": 1})
    )
    assert len(first) == 2 and len(second) == 1
    assert {p["id"] for p in first}.isdisjoint({p["id"] for p in second})


def test_conversation_search_filters_roles_and_dates(tools):
    found = json.loads(tools.call("conversation_search", {"query": "basil", "roles": ["user"]}))
    assert found[0]["content"] == "I water the basil every Monday."
    assert {m["role"] for m in found} == {"user"}
    later = json.loads(
        tools.call("conversation_search", {"query": "basil flight", "start_date": "2024-03-10"})
    )
    assert [m["content"] for m in later] == ["My flight is QX2208."]  # the only later message


def test_bad_calls_come_back_as_errors(tools):
    assert tools.call("delete_everything", "{}").startswith("Error: there is no tool")
    assert "not valid JSON" in tools.call("conversation_search", "{oops")
    deep = "[" * 5000 + "]" * 5000  # a model's runaway output: a sentence, not RecursionError
    assert "nests deeper than 64 levels" in tools.call("conversation_search", deep)
    assert "wrong arguments" in tools.call("conversation_search", {"q": "x"})


def test_tool_loop_runs_the_models_calls(server, tools):
    backend = OpenAIChatBackend(f"http://127.0.0.1:{server.server_port}/v1")
    run = run_with_tools(backend, tools, [{"role": "user", "content": "I like tea."}])
    assert run.finished and run.steps == 2
    assert run.text == "Done. [remembered]"
    assert [c.name for c in run.calls] == ["core_memory_append"]
    assert tools.core.get("human").value.endswith("Likes tea.")
    second = server.requests[-1][1]["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": "call_1", "content": run.calls[0].result}


def test_remote_counts_use_tokenize_then_usage(server):
    backend = OpenAIChatBackend(f"http://127.0.0.1:{server.server_port}")
    chat = [{"role": "user", "content": "one two three"}]
    assert backend.count_tokens(chat) == 3 + 4 + 3
    assert backend.count_method == "server /tokenize"
    assert backend.context_window == 2048
    server.tokenize = False
    fallback = OpenAIChatBackend(f"http://127.0.0.1:{server.server_port}", context_window=512)
    assert fallback.count_tokens(chat) == 11
    assert fallback.count_method == "server usage (max_tokens=1)"
    sent = server.requests[-1][1]
    assert sent["max_tokens"] == 1
    before = len(server.requests)
    fallback.count_tokens(chat)  # cached: no second request
    assert len(server.requests) == before
    reply = fallback.generate([chat], 8)[0]
    assert reply.text == "Done. [remembered]" and reply.prompt_tokens == 11


def test_unreachable_server_is_one_sentence():
    backend = OpenAIChatBackend("http://127.0.0.1:9", context_window=100, timeout_s=2)
    with pytest.raises(CtxlabError, match="cannot reach"):
        backend.generate([[{"role": "user", "content": "hi"}]], 4)


def test_default_model_name_becomes_the_servers_only_model(server):
    """`--served-model` left at "default" sends the one model the server lists (asked once);
    several, none or no /v1/models keep "default"; a given name is never looked up."""
    url = f"http://127.0.0.1:{server.server_port}"
    chat = [{"role": "user", "content": "hi"}]
    server.models = ["smollm2-135m"]
    backend = OpenAIChatBackend(url)
    backend.generate([chat, chat], 4)
    assert [body["model"] for _, body in server.requests] == ["smollm2-135m"] * 2
    assert server.gets == ["/v1/models"]
    for listed in (["a", "b"], [], None):
        server.models, server.requests[:] = listed, []
        OpenAIChatBackend(url).generate([chat], 4)
        assert server.requests[-1][1]["model"] == "default"
    server.gets.clear()
    OpenAIChatBackend(url, model="mine").generate([chat], 4)
    assert server.requests[-1][1]["model"] == "mine" and server.gets == []
