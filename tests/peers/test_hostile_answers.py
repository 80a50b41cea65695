"""Hostile or broken servers: a field of the wrong type, an SSE event that is not an object,
an impossible value. Every command that reads the answer ends in one sentence naming the
field and the server (exit 2), never a traceback, and never reports the value as measured.
"""

from __future__ import annotations

import contextlib
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxlab.peer import fields
from ctxlab.peer.sse import events
from tests.peers.commands import CHAT, STREAMING, argv
from tests.peers.hostile import Script, good_events, good_reply, hostile, words


def _usage(**change):
    """A stream whose usage event has `change` applied (a value of None drops the key)."""

    def make(body):
        out = good_events(body)
        usage = dict(out[-1]["usage"])
        details = dict(usage["prompt_tokens_details"])
        for key, value in change.items():
            target = details if key == "cached_tokens" else usage
            target[key] = value(words(body)) if callable(value) else value
        usage["prompt_tokens_details"] = details
        out[-1] = {"choices": [], "usage": usage}
        return out

    return make


STREAMED = {
    "usage a list": (lambda b: [*good_events(b)[:2], {"choices": [], "usage": [1, 2]}], "usage"),
    "cached_tokens a string": (_usage(cached_tokens="3"), "cached_tokens"),
    "data a list": (lambda b: [[1, 2]], "not a JSON object"),
    "data a number": (lambda b: [42], "not a JSON object"),
    "choices an object": (lambda b: [{"choices": {"text": "x"}}], "choices"),
    "cached above the prompt": (_usage(cached_tokens=lambda n: n + 5), "more cached tokens"),
    "cached 1e30": (_usage(cached_tokens=1e30), "cached_tokens"),
    "negative prompt tokens": (_usage(prompt_tokens=-3), "usage.prompt_tokens"),
    "negative completion tokens": (_usage(completion_tokens=-1), "usage.completion_tokens"),
    # the issue 33 re-walk's variants
    "text a number": (
        lambda b: [{"choices": [{"index": 0, "text": 7}]}, *good_events(b)[1:]],
        "choices[0].text = 7",
    ),
    "prompt tokens a bool": (_usage(prompt_tokens=True), "usage.prompt_tokens = true"),
    "prompt tokens 3.5": (_usage(prompt_tokens=3.5), "usage.prompt_tokens = 3.5"),
}


def _reply(change):
    def make(body):
        doc = good_reply(body)
        change(doc, words(body))
        return doc

    return make


WHOLE = {
    "message a string": (_reply(lambda d, n: d["choices"][0].update(message="hi")), "message"),
    "choices an object": (_reply(lambda d, n: d.update(choices={"a": 1})), "choices"),
    "usage a list": (_reply(lambda d, n: d.update(usage=[1])), "usage"),
    "negative prompt tokens": (
        _reply(lambda d, n: d["usage"].update(prompt_tokens=-4)),
        "usage.prompt_tokens",
    ),
    "cached above the prompt": (
        _reply(lambda d, n: d["usage"].update(prompt_tokens_details={"cached_tokens": n + 9})),
        "more cached tokens",
    ),
    # the issue 33 re-walk's variants
    "content a list": (
        _reply(lambda d, n: d["choices"][0]["message"].update(content=["a"])),
        "choices[0].message.content",
    ),
    "choices empty": (_reply(lambda d, n: d.update(choices=[])), "not a list with one choice"),
    "answer a string": (lambda b: json.dumps("hello"), "not a JSON object"),
    "answer an HTML page": (lambda b: "<html><body>hi</body></html>", "did not answer with JSON"),
    "prompt tokens a bool": (
        _reply(lambda d, n: d["usage"].update(prompt_tokens=True)),
        "usage.prompt_tokens = true",
    ),
}


def _one_sentence(result, phrase: str) -> None:
    assert result.code == 2, (result.code, result.out[-500:], result.err)
    assert "Traceback" not in result.err
    lines = result.err_lines
    assert lines[-1].startswith("error: ") and phrase in lines[-1], result.err
    assert "127.0.0.1" in lines[-1]  # it names the server


@pytest.mark.parametrize("name", STREAMING)
@pytest.mark.parametrize("mode", sorted(STREAMED))
def test_a_broken_stream_is_one_sentence(cli, tmp_path, rag_db, name, mode):
    make, phrase = STREAMED[mode]
    with hostile(Script(events=make)) as (url, _):
        result = cli(*argv(name, url, tmp_path, rag_db))
    _one_sentence(result, phrase)


@pytest.mark.parametrize("name", CHAT)
@pytest.mark.parametrize("mode", sorted(WHOLE))
def test_a_broken_chat_answer_is_one_sentence(cli, tmp_path, rag_db, name, mode):
    make, phrase = WHOLE[mode]
    with hostile(Script(reply=make)) as (url, _):
        result = cli(*argv(name, url, tmp_path, rag_db))
    _one_sentence(result, phrase)


@pytest.mark.parametrize(
    ("script", "phrase"),
    [
        (Script(models={"data": [{"id": None}]}), "data[0].id = null"),
        (Script(models={"data": {"id": "m"}}), "data = "),
        (Script(tokenize={"tokens": ["a", "b"]}), "tokens[0]"),
        (Script(props={"total_slots": "four"}), "total_slots"),
        (Script(props={"total_slots": 2, "default_generation_settings": []}), "default_gen"),
        (Script(models={"data": [{"id": 7}]}), "data[0].id = 7"),
        (Script(models={"data": "m"}), 'data = "m"'),
    ],
    ids=[
        "model id null",
        "models data an object",
        "tokenize strings",
        "props slots",
        "props settings a list",
        "model id a number",
        "models data a string",
    ],
)
@pytest.mark.parametrize("name", ["probe", "workshop"])
def test_a_broken_info_endpoint_is_one_sentence(cli, tmp_path, script, phrase, name):
    with hostile(script) as (url, _):
        if name == "probe":
            result = cli("probe", "--server", url, "--out", str(tmp_path / "p.json"), "--yes")
        else:  # the server is checked before the workshop loads its model
            result = cli("workshop", "--server", url, "--out", str(tmp_path / "w"))
    _one_sentence(result, phrase)


def test_rag_refuses_a_null_model_id(cli, tmp_path, rag_db):
    with hostile(Script(models={"data": [{"id": None}]})) as (url, _):
        result = cli(*argv("rag", url, tmp_path, rag_db))
    _one_sentence(result, "data[0].id = null")


def test_impossible_capacity_gauges_are_not_measured():
    from ctxlab.probe.metrics import parse, published_capacity, usage_gauge

    for value in ("NaN", "+Inf", "-Inf", "-0.5", "7"):
        gauge = usage_gauge(parse(f"vllm:kv_cache_usage_perc {value}\n"))
        assert gauge.value is None and gauge.how == "not measurable", value
    assert usage_gauge(parse("vllm:kv_cache_usage_perc 0.25\n")).value == 0.25
    negative = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="-40"} 1\n'
    assert published_capacity(parse(negative)).value is None
    for value in ("NaN", "+Inf", "-5", "1.5"):
        fig = published_capacity(parse(f"sglang:max_total_num_tokens {value}\n"))
        assert fig.value is None and fig.how == "not measurable", value


def test_a_probe_report_has_no_nan_where_the_server_publishes_nan(cli, tmp_path):
    metrics = (
        "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc NaN\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="-3"} 1\n'
    )
    with hostile(Script(metrics=metrics)) as (url, _):
        out = tmp_path / "p.json"
        result = cli("probe", "--server", url, "--out", str(out), "--yes", "--sections",
                     "prefix,capacity", "--max-requests", "4")  # fmt: skip
    assert result.code == 0, result.err
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the report"))
    capacity = {f["name"]: f for f in doc["sections"]["capacity"]}
    assert capacity["KV usage gauge now"]["how"] == "not measurable"
    assert capacity["capacity published in /metrics"]["value"] is None


# -- the accessors themselves, on anything JSON can hold ------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
SRC = fields.Source("http://alice:pw@127.0.0.1:9", "POST /v1/completions")


@given(usage=JSON, timings=JSON)
def test_usage_is_a_checked_value_or_one_sentence(usage, timings):
    try:
        got = fields.usage(SRC, usage, timings)
    except fields.BadAnswer as exc:
        assert "127.0.0.1:9" in str(exc) and "pw" not in str(exc).replace("POST", "")
        return
    for n in (got.prompt_tokens, got.completion_tokens, got.cached_tokens):
        assert n is None or (isinstance(n, int) and 0 <= n <= fields.MAX_COUNT)
    if got.cached_tokens is not None and got.prompt_tokens is not None:
        assert got.cached_tokens <= got.prompt_tokens


@given(doc=JSON)
def test_a_chat_answer_is_text_or_one_sentence(doc):
    with contextlib.suppress(fields.BadAnswer):
        assert isinstance(fields.message_text(SRC, doc), str)


@given(data=st.lists(JSON, max_size=4))
def test_stream_events_are_objects_or_one_sentence(data):
    lines = [f"data: {json.dumps(d)}" for d in data] + [": keep-alive", "data: [DONE]"]
    with contextlib.suppress(fields.BadAnswer):
        for doc in events(SRC, lines):
            assert isinstance(doc, dict)
            text = fields.choice_text(SRC, doc, chat=False)
            assert text is None or isinstance(text, str)


def test_counts_refuse_what_cannot_be_a_count():
    for bad in (-1, 1e30, math.nan, math.inf, "3", [3], True, 2.5):
        with pytest.raises(fields.BadAnswer):
            fields.count(SRC, bad, "x")
    assert fields.count(SRC, 12.0, "x") == 12 and fields.count(SRC, None, "x") is None
