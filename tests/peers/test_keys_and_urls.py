"""Keys and base URLs: `eval --backend openai` sends `--api-key` (or $OPENAI_API_KEY) as the
other commands do, and every command takes a base URL with or without `/v1` by one rule."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxlab.errors import CtxlabError
from ctxlab.peer.url import base_url
from tests.peers.commands import COMMANDS, argv
from tests.peers.hostile import Script, hostile


def test_eval_sends_the_api_key(cli, tmp_path, rag_db, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with hostile(Script(key="k-123")) as (url, script):
        refused = cli(*argv("eval", url, tmp_path / "a", rag_db))
        given_key = cli(*argv("eval", url, tmp_path / "b", rag_db), "--api-key", "k-123")
        monkeypatch.setenv("OPENAI_API_KEY", "k-123")
        from_env = cli(*argv("eval", url, tmp_path / "c", rag_db))
    assert refused.code == 2 and "refused the API key" in refused.err
    assert "--api-key" in refused.err and "k-123" not in refused.err
    assert given_key.code == 0, given_key.err
    assert from_env.code == 0, from_env.err
    assert "Bearer k-123" in script.auth


@pytest.mark.parametrize("name", COMMANDS)
def test_a_base_url_ending_in_v1_reaches_the_same_server(cli, tmp_path, rag_db, name):
    with hostile() as (url, script):
        result = cli(*argv(name, url + "/v1/", tmp_path, rag_db))
    assert result.code == 0, result.err
    assert script.posts and not any(p.startswith("/v1/v1") for p in script.posts)


def test_bench_exits_non_zero_when_every_timed_request_failed(cli, tmp_path, rag_db):
    """The test request succeeds, every timed request gets HTTP 500: nothing was
    measured, so the run fails (and its result file is strict JSON, no NaN)."""
    with hostile(Script(fail_after=1)) as (url, _):
        result = cli(*argv("bench", url, tmp_path, rag_db))
    assert result.code == 1, result.err
    assert "every timed request failed (2 of 2)" in result.err and "HTTP 500" in result.err
    text = (tmp_path / "bench" / "result.json").read_text()
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in result.json"))
    assert doc["completed"] == 0 and doc["failed"] == 2


def test_bench_with_one_timed_request_answered_exits_zero(cli, tmp_path, rag_db):
    with hostile(Script(fail_after=2)) as (url, _):
        result = cli(*argv("bench", url, tmp_path, rag_db))
    assert result.code == 0, result.err
    assert "Failed requests:                         1" in result.out


_HOST = st.sampled_from(["127.0.0.1:8000", "gpu-box", "[::1]:9000", "h.example:443"])
_PATH = st.sampled_from(["", "/", "/v1", "/v1/", "/api", "/api/v1"])


@given(scheme=st.sampled_from(["http", "https"]), host=_HOST, path=_PATH)
def test_one_rule_for_every_base_url(scheme, host, path):
    root = base_url(f"{scheme}://{host}{path}")
    assert not root.endswith("/") and not root.endswith("/v1")
    assert base_url(root + "/v1") == root == base_url(root + "/")
    assert root.startswith(f"{scheme}://{host}")


@pytest.mark.parametrize("bad", ["127.0.0.1:8000", "ftp://h", "http://", "http://h:99999"])
def test_a_base_url_that_is_not_one_is_one_sentence(bad):
    with pytest.raises(CtxlabError, match="--base-url"):
        base_url(bad)


@given(
    host=_HOST,
    prefix=st.sampled_from(["", "/api", "/v1/../x"]),
    endpoint=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/models",
                              "/chat/completions", "/tokenize", "/metrics"]),
    slash=st.sampled_from(["", "/"]),
)  # fmt: skip
def test_a_base_url_that_names_an_endpoint_says_the_root_to_give(host, prefix, endpoint, slash):
    """`--base-url http://h/v1/chat/completions` was taken as a root and sent to
    /v1/chat/completions/v1/completions (a 404 naming the doubled path)."""
    with pytest.raises(CtxlabError) as err:
        base_url(f"http://{host}{prefix}{endpoint}{slash}")
    message = str(err.value)
    assert f"names an endpoint ({endpoint})" in message
    assert f"give the server's root, http://{host}{prefix}" in message
