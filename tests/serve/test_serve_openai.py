"""A real `ctxlab serve` process on loopback, driven by the official `openai` SDK (sync, async,
streaming) and by curl: the same greedy text as the in-process engine, usage with cached
tokens, OpenAI's error shape for every bad input (the server keeps serving), API keys and
zero cross-tenant prefix hits."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess

import httpx
import openai
import pytest

from ctxlab.engine import LLM, SamplingParams
from tests.serve.conftest import ctxlab_serve, metric

pytestmark = [pytest.mark.model, pytest.mark.server]

MODEL = "smollm2-135m"
ALICE, ALICE2, BOB = "sk-alice-0001", "sk-alice-0002", "sk-bob-000001"
PROMPTS = [
    "The three primary colours of light are",
    "def fibonacci(n):\n    ",
    "A haiku about the sea:\n",
    "List four planets of the solar system:",
]
CHAT = [{"role": "user", "content": "Name a fruit that is yellow."}]


@pytest.fixture(scope="module")
def url(serve_model, tmp_path_factory, request) -> str:
    """Its own server, not the session's: it needs tenants (--api-keys), ctxlab's metric
    names (the shared one publishes vLLM's) and 16-token pages."""
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(f'[keys]\n"{ALICE}" = "alice"\n"{ALICE2}" = "alice"\n"{BOB}" = "bob"\n')
    load = lambda: request.getfixturevalue("loaded")  # noqa: E731
    with ctxlab_serve(
        "--api-keys", str(keys), "--kv-pool-tokens", "4096", while_starting=load
    ) as base:
        yield base


@pytest.fixture(scope="module")
def reference(loaded):
    """Greedy text of the in-process engine (what the server must answer)."""
    llm = LLM(loaded, kv_pool_tokens=1024)

    def run(prompt, n: int) -> tuple[str, int, int]:
        out = llm.generate(prompt, SamplingParams(max_tokens=n))[0]
        return out.text, len(out.prompt_token_ids), len(out.token_ids)

    return run


def client(url: str, key: str = ALICE) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_sync_sdk_completion_and_chat(url, reference):
    c = client(url)
    r = c.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    text, n_prompt, n_out = reference(PROMPTS[0], 12)
    assert r.choices[0].text == text and r.object == "text_completion"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, n_out)
    assert r.usage.total_tokens == n_prompt + n_out
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    r = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, temperature=0)
    text, n_prompt, _ = reference(CHAT, 10)
    assert r.choices[0].message.content == text and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == n_prompt
    again = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == (n_prompt - 1) // 16 * 16 > 0


def test_streaming_sdk_with_usage(url, reference):
    c = client(url)
    stream = c.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text, n_prompt, n_out = reference(CHAT, 10)
    content = [ch.choices[0].delta.content for ch in chunks if ch.choices]
    assert chunks[0].choices[0].delta.role == "assistant" and content[0]  # role + first text
    assert "".join(c or "" for c in content) == text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == n_out
    assert last.usage.prompt_tokens == n_prompt
    assert all(ch.usage is None for ch in chunks[:-1])
    # completions stream, without usage
    parts = list(
        c.completions.create(
            model=MODEL, prompt=PROMPTS[1], max_tokens=8, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in parts) == reference(PROMPTS[1], 8)[0]


def _sse(url: str, path: str, body: dict) -> list[dict]:
    """Every `data:` document of a streamed answer, raw (the SDK would hide unknown keys)."""
    headers = {"Authorization": f"Bearer {ALICE}"}
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200, r.read()
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_continuous_usage_stats_gives_running_counts(url, reference):
    """vLLM's `stream_options.continuous_usage_stats`: each text chunk carries its prompt's
    usage so far; the last usage chunk is unchanged; without include_usage it adds nothing
    (vLLM's `should_include_usage`)."""
    both = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": both}  # fmt: skip
    *chunks, last = _sse(url, "/v1/chat/completions", body)
    n_prompt = last["usage"]["prompt_tokens"]  # the reference's (test_sync_sdk_...)
    made = [c["usage"]["completion_tokens"] for c in chunks]
    assert made == sorted(made) and made[0] >= 1 and made[-1] == 6, made
    for c in chunks:
        u = c["usage"]
        assert set(u) == {"prompt_tokens", "completion_tokens", "total_tokens"}
        assert u["prompt_tokens"] == n_prompt
        assert u["total_tokens"] == n_prompt + u["completion_tokens"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    assert "cached_tokens" in last["usage"]["prompt_tokens_details"]
    # completions of two prompts: each chunk counts its own prompt
    prompts = PROMPTS[:2]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": both}  # fmt: skip
    *chunks, last = _sse(url, "/v1/completions", body)
    for i, prompt in enumerate(prompts):
        mine = [c["usage"] for c in chunks if c["choices"][0]["index"] == i]
        assert {u["prompt_tokens"] for u in mine} == {reference(prompt, 1)[1]}
        made = [u["completion_tokens"] for u in mine]
        assert made == sorted(made) and made[-1] == 4, made
    assert last["usage"]["completion_tokens"] == 8
    # continuous_usage_stats alone: no usage anywhere, as vLLM
    body["stream_options"] = {"continuous_usage_stats": True}
    docs = _sse(url, "/v1/completions", body)
    assert all("usage" not in d for d in docs) and all(d["choices"] for d in docs)


def test_async_sdk_concurrent_requests(url, reference):
    async def run() -> list:
        c = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=ALICE, max_retries=0)
        calls = [
            c.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0)
            for p in PROMPTS
        ]
        async with c:
            return await asyncio.gather(*calls)

    results = asyncio.run(run())
    assert [r.choices[0].text for r in results] == [reference(p, 8)[0] for p in PROMPTS]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl(url, reference):
    body = json.dumps({"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 6, "temperature": 0})
    auth = ["-H", f"Authorization: Bearer {ALICE}"]
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "60", f"{url}/v1/completions", *auth, "-d", body],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout)["choices"][0]["text"] == reference(PROMPTS[2], 6)[0]
    chat = {"model": MODEL, "messages": CHAT, "max_tokens": 6, "temperature": 0, "stream": True}
    out = subprocess.run(
        ["curl", "-sSN", "--max-time", "60", f"{url}/v1/chat/completions", *auth,
         "-H", "Content-Type: application/json", "-d", json.dumps(chat)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    events = [ln[6:] for ln in out.stdout.splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    docs = [json.loads(e) for e in events[:-1]]
    text = "".join(d["choices"][0]["delta"].get("content", "") for d in docs)
    assert text == reference(CHAT, 6)[0]
    health = subprocess.run(["curl", "-sS", f"{url}/health"], capture_output=True, text=True)
    assert health.stdout == "{}"


BAD = [
    (b'{"model": "smollm2-135m", "prompt": ', "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    ({"model": MODEL, "prompt": 5}, "prompt"),
    ({"model": MODEL, "prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 10**9}, "maximum context length is 8192"),
    ({"model": MODEL, "prompt": "hi", "colour": "red"}, "unknown field 'colour'"),
    ({"model": "gpt-4", "prompt": "hi"}, "model 'gpt-4' is not served here"),
    ({"prompt": "hi"}, "model is required"),
    ({"model": MODEL, "prompt": ""}, "prompt is empty"),
    ({"model": MODEL, "prompt": "hi", "n": 2}, "n is not supported"),
    ({"model": MODEL, "prompt": list(range(1000, 10000))}, "9000 in the prompt"),
    ({"model": MODEL, "prompt": "hi", "stream_options": {"include_usage": True}}, "stream"),
    ({"model": MODEL, "prompt": [99999999]}, "outside the model's vocabulary"),
    # the second tour's classes: nesting, non-finite numbers, text, ids, seeds
    (b'{"model": "smollm2-135m", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nests deeper"),
    (b'{"model": "smollm2-135m", "prompt": "hi", "temperature": NaN}', "NaN"),
    ({"model": MODEL, "prompt": "hi \ud800 there"}, "lone surrogate"),
    ({"model": MODEL, "prompt": [5, -1]}, "token id -1 at prompt[1] is out of range"),
    ({"model": MODEL, "prompt": "hi", "seed": 2**64}, "seed"),
    # the issue 33 re-walk's variants: absurd sizes and counts
    ({"model": MODEL, "prompt": "hi", "max_tokens": 10**30}, "maximum context length is 8192"),
    ({"model": MODEL, "prompt": "hi", "n": 10**9}, "n is not supported"),
    ({"model": MODEL, "prompt": "hi", "stop": [f"x{i}" for i in range(100_000)]}, "stop"),
    ({"model": MODEL, "prompt": "hi", "seed": -1}, "seed"),
    (b'{"model": "smollm2-135m", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "4,300"),
]
BAD_CHAT = [
    ({"model": MODEL, "messages": []}, "messages is empty"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"model": MODEL, "messages": [{"role": "user"}]}, "content is required"),
    ({"model": MODEL, "messages": "hello"}, "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "a\udc00"}]}, "messages[0].content"),
]


@pytest.mark.parametrize(
    "path,body,needle",
    [("/v1/completions", b, n) for b, n in BAD]
    + [("/v1/chat/completions", b, n) for b, n in BAD_CHAT],
)
def test_bad_input_is_a_400_and_the_server_keeps_serving(url, path, body, needle):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {ALICE}", "Content-Type": "application/json"}
    r = httpx.post(url + path, content=data, headers=headers, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and needle in err["message"], err
    ok = client(url).completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    assert ok.usage.completion_tokens == 1


def test_api_keys(url):
    assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200  # no key needed
    assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        client(url, "sk-nobody-0000").completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    models = client(url, BOB).models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_tenants_never_share_cached_blocks(url):
    prompt = "Tenant isolation check: " + " ".join(f"w{i}" for i in range(60))

    def cached(key: str, **extra) -> int:
        r = client(url, key).completions.create(
            model=MODEL, prompt=prompt, max_tokens=1, extra_body=extra or None
        )
        return r.usage.prompt_tokens_details.cached_tokens

    def hits() -> float:
        return metric(httpx.get(f"{url}/metrics").text, "ctxlab:prefix_cache_hits_total")

    assert cached(ALICE) == 0
    assert cached(ALICE2) >= 48  # another key of the same tenant shares its cache
    before = hits()
    assert cached(BOB) == 0  # same prompt, other tenant: no hit at all
    assert hits() == before
    assert cached(BOB) >= 48  # bob's own blocks are now cached for bob
    assert cached(ALICE, cache_salt="project-x") == 0  # a salt narrows sharing in a tenant


def test_metrics_use_vllm_names_with_the_ctxlab_prefix(url):
    client(url).completions.create(model=MODEL, prompt="Hello", max_tokens=3)
    r = httpx.get(f"{url}/metrics", timeout=10)
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        "prompt_tokens_total",
        "generation_tokens_total",
        "num_preemptions_total",
        "time_to_first_token_seconds_bucket",
        "inter_token_latency_seconds_bucket",
        "request_time_per_output_token_seconds_bucket",
        "e2e_request_latency_seconds_bucket",
        "kv_resident_bytes",
        "kv_policy_evicted_bytes_total",
    ):
        assert f"ctxlab:{name}{{" in text, name
    assert metric(text, "ctxlab:request_success_total", finished_reason="length") >= 1
    assert 'model_name="smollm2-135m"' in text
