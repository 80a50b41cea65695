"""Under load, against a real `ctxlab serve` process: 64 concurrent streams with the KV pool at
10 % of their demand all complete with the greedy text each gives alone; with half of the
clients leaving mid-stream the pool's free blocks return to their starting count; and the
/metrics counters agree with what the clients counted."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from ctxlab.engine import LLM, SamplingParams
from tests.serve.conftest import ctxlab_serve, metric

pytestmark = [pytest.mark.model, pytest.mark.server]

N = 64
OUT = 6
DISTINCT = 16  # 16 prompts x 4 tenants' salts: no two streams share a block
SUBJECTS = ["river", "mountain", "library", "garden", "harbour", "engine", "violin", "desert"]
VERBS = ["describe", "praise", "explain", "remember"]
TEXTS = [
    f"Request {i}: in two short sentences, {VERBS[i % 4]} the old {SUBJECTS[i % 8]} of the "
    f"town number {i}, and say why it matters to people."
    for i in range(DISTINCT)
]  # 28-30 tokens: two pages of 16 at admission, a third one during decode
PROMPTS = [TEXTS[i % DISTINCT] for i in range(N)]
SALTS = [f"stream-group-{i // DISTINCT}" for i in range(N)]


@pytest.fixture(scope="module")
def prompt_ids(loaded) -> list[list[int]]:
    return [loaded.tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def pool_tokens(prompt_ids) -> int:
    demand = sum(len(p) + OUT for p in prompt_ids)
    return demand // 10 // 16 * 16  # 10 % of what 64 streams need at once, in whole pages


@pytest.fixture(scope="module")
def url(serve_model, pool_tokens, request):
    """Its own server, not the session's: a pool sized to this test's demand, a waiting
    queue of 64, and /metrics counters that must count only this test's requests."""
    args = ("--kv-pool-tokens", str(pool_tokens), "--max-waiting", str(N))
    with ctxlab_serve(*args, while_starting=lambda: request.getfixturevalue("solo")) as base:
        yield base


@pytest.fixture(scope="module")
def solo(loaded, prompt_ids) -> list[list[int]]:
    """Each prompt's greedy tokens, run alone in this process."""
    llm = LLM(loaded, kv_pool_tokens=256)
    params = SamplingParams(max_tokens=OUT, ignore_eos=True)
    alone = [llm.generate(p, params)[0].token_ids for p in prompt_ids[:DISTINCT]]
    return [alone[i % DISTINCT] for i in range(N)]


def body(i: int) -> dict:
    return {
        "model": "smollm2-135m",
        "prompt": PROMPTS[i],
        "max_tokens": OUT,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_salt": SALTS[i],
    }


async def one_stream(c: httpx.AsyncClient, url: str, i: int, leave_after: int | None) -> dict:
    """Stream request i; with `leave_after`, close the connection after that many chunks."""
    chunks: list[str] = []
    usage = None
    async with c.stream("POST", f"{url}/v1/completions", json=body(i)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            if doc["choices"]:
                chunks.append(doc["choices"][0]["text"])
            else:
                usage = doc["usage"]
            if leave_after is not None and len(chunks) >= leave_after:
                return {"text": "".join(chunks), "usage": None, "left": True}
    return {"text": "".join(chunks), "usage": usage, "left": False}


def run_all(url: str, leave: set[int]) -> list[dict]:
    async def go() -> list[dict]:
        limits = httpx.Limits(max_connections=N + 8)
        async with httpx.AsyncClient(timeout=120, limits=limits) as c:
            calls = [one_stream(c, url, i, 2 if i in leave else None) for i in range(N)]
            return await asyncio.gather(*calls)

    return asyncio.run(go())


def scrape(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=30).text


def test_64_streams_on_a_tenth_of_their_pool(url, loaded, prompt_ids, solo):
    before = scrape(url)
    results = run_all(url, set())
    after = scrape(url)
    tok = loaded.tokenizer
    assert [r["text"] for r in results] == [tok.decode(s) for s in solo]
    assert all(r["usage"]["completion_tokens"] == OUT for r in results)
    assert [r["usage"]["prompt_tokens"] for r in results] == [len(p) for p in prompt_ids]

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("ctxlab:num_preemptions_total") > 0  # the pool really was short
    assert delta("ctxlab:request_success_total", finished_reason="length") == N
    assert delta("ctxlab:prompt_tokens_total") == sum(r["usage"]["prompt_tokens"] for r in results)
    assert delta("ctxlab:generation_tokens_total") == N * OUT
    assert delta("ctxlab:time_to_first_token_seconds_count") == N
    assert delta("ctxlab:e2e_request_latency_seconds_count") == N
    assert delta("ctxlab:inter_token_latency_seconds_count") == N * (OUT - 1)
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results)
    assert cached == 0  # distinct (prompt, salt) pairs: no stream reuses another's blocks
    assert metric(after, "ctxlab:num_requests_running") == 0


def test_half_the_clients_leave_and_every_block_comes_back(url, prompt_ids, solo):
    before = scrape(url)
    free0 = metric(before, "ctxlab:kv_blocks_free")
    assert free0 == metric(before, "ctxlab:kv_blocks_total")
    leave = set(range(0, N, 2))
    results = run_all(url, leave)
    stayed = [r for i, r in enumerate(results) if i not in leave]
    assert all(r["usage"]["completion_tokens"] == OUT for r in stayed)
    after = scrape(url)
    for _ in range(100):  # aborts land between engine steps
        if metric(after, "ctxlab:num_requests_running") == 0:
            break
        asyncio.run(asyncio.sleep(0.05))
        after = scrape(url)
    assert metric(after, "ctxlab:kv_blocks_free") == free0
    assert metric(after, "ctxlab:kv_resident_bytes") == 0

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("ctxlab:request_success_total", finished_reason="abort") == len(leave)
    assert delta("ctxlab:request_success_total", finished_reason="length") == N - len(leave)
    assert delta("ctxlab:prompt_tokens_total") == sum(len(p) for p in prompt_ids)
    generated = delta("ctxlab:generation_tokens_total")
    assert (N - len(leave)) * OUT + 2 * len(leave) <= generated <= N * OUT
    # the server still answers, with the same text
    again = asyncio.run(_one(url))
    assert again["text"] == stayed[0]["text"] and again["usage"]["completion_tokens"] == OUT


async def _one(url: str) -> dict:
    async with httpx.AsyncClient(timeout=60) as c:
        return await one_stream(c, url, 1, None)
