"""Failures through the server, over real HTTP to the app in a thread of this process (so a
test can build the engine: the issue's SnapKV repro, an injected engine fault): a request
that fails fails alone (400 or 500 for that client), its blocks go back to the pool, the
others finish, and so do timeouts, disconnects and a full queue (429)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from ctxlab.engine import LLM, SamplingParams
from ctxlab.engine.runner import Runner
from tests.serve.conftest import in_process, metric

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]

LONG = (
    "The history of the printing press begins in the fifteenth century, when a goldsmith in "
    "Mainz combined movable metal type, oil-based ink and a screw press. Explain why it spread "
    "so quickly across Europe and what it changed for ordinary readers and their towns. Give "
    "three reasons, name one early printed book, and compare the cost of a printed page with "
    "the cost of a page copied by hand in a monastery scriptorium of the same decade."
)


@pytest.fixture(scope="module")
def short45(loaded) -> list[int]:
    return loaded.tokenizer.encode(" ".join(["word"] * 60))[:45]


def post(url: str, body: dict, path: str = "/v1/completions", **kw) -> httpx.Response:
    return httpx.post(url + path, json={"model": "m", "temperature": 0, **body}, timeout=60, **kw)


def pool_is_free(url: str) -> bool:
    text = httpx.get(f"{url}/metrics").text
    free = metric(text, "ctxlab:kv_blocks_free")
    return free == metric(text, "ctxlab:kv_blocks_total") and free > 0


async def stream_text(client: httpx.AsyncClient, url: str, body: dict) -> tuple[str, list[dict]]:
    """(text, parsed events) of a streamed completion."""
    docs: list[dict] = []
    greedy = {"temperature": 0, **body, "stream": True}
    async with client.stream("POST", f"{url}/v1/completions", json=greedy) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                docs.append(json.loads(line[6:]))
    text = "".join(d["choices"][0]["text"] for d in docs if d.get("choices"))
    return text, docs


def test_snapkv_repro_is_refused_and_a_step_failure_stays_one_clients(loaded, short45):
    llm = LLM(loaded, policy="snapkv", budget=0.5, kv_pool_tokens=2048)
    llm.engine.policy.lift = lambda b: b  # a budget that is not lifted to the policy's floor
    with in_process(llm.engine) as url:
        r = post(url, {"prompt": short45, "max_tokens": 4})
        assert r.status_code == 400
        assert "cannot run under snapkv with budget 0.5" in r.json()["error"]["message"]
        assert pool_is_free(url)
        # Switched off, the same prompt fails inside a step, batched with a running stream.
        llm.engine._check_policy_floor = lambda n: None  # type: ignore[method-assign]

        async def run() -> tuple[httpx.Response, str, list[dict]]:
            async with httpx.AsyncClient(timeout=60) as c:
                body = {"model": "m", "prompt": LONG, "max_tokens": 12, "ignore_eos": True}
                long_task = asyncio.create_task(stream_text(c, url, body))
                await asyncio.sleep(0.3)  # the long request is decoding by now
                bad = await c.post(
                    f"{url}/v1/completions", json={"model": "m", "prompt": short45, "max_tokens": 4}
                )
                text, docs = await long_task
                return bad, text, docs

        bad, text, docs = asyncio.run(run())
        assert bad.status_code == 400, bad.text
        assert "too small for snapkv" in bad.json()["error"]["message"]
        assert docs[-1]["choices"][0]["finish_reason"] == "length" and text
        assert llm.engine.num_failed_steps >= 1
        m = httpx.get(f"{url}/metrics").text
        assert metric(m, "ctxlab:request_success_total", finished_reason="error") == 1
        assert metric(m, "ctxlab:step_failures_total") >= 1
        assert metric(m, "ctxlab:kv_policy_evicted_bytes_total") > 0  # SnapKV dropped tokens
        assert pool_is_free(url)
        assert post(url, {"prompt": LONG, "max_tokens": 2}).status_code == 200


def test_an_engine_fault_is_a_500_for_that_client_alone(loaded, monkeypatch):
    marker = loaded.tokenizer.encode(" zebra")[-1]
    real_run = Runner.run

    def run(self, batch):
        if any(marker in s.seq.prompt_ids and s.num_new == 1 for s in batch):
            raise RuntimeError("injected fault")
        return real_run(self, batch)

    monkeypatch.setattr(Runner, "run", run)
    prompts = ["Once upon a time", "The best way to learn", "Rain in the desert"]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    solo = [LLM(loaded, kv_pool_tokens=512).generate(p, params)[0].text for p in prompts]
    llm = LLM(loaded, kv_pool_tokens=2048)
    with in_process(llm.engine) as url:

        async def go() -> tuple[list[str], httpx.Response, list[dict]]:
            async with httpx.AsyncClient(timeout=60) as c:
                ok = [
                    stream_text(c, url, {"model": "m", "prompt": p, "max_tokens": 6,
                                         "ignore_eos": True})
                    for p in prompts
                ]  # fmt: skip
                zebra = {"model": "m", "prompt": "A zebra", "max_tokens": 5}
                plain = c.post(f"{url}/v1/completions", json=zebra)
                streamed = stream_text(c, url, {"model": "m", "prompt": "My zebra"})
                *texts, bad, (_, docs) = await asyncio.gather(*ok, plain, streamed)
                return [t for t, _ in texts], bad, docs

        texts, bad, docs = asyncio.run(go())
        assert texts == solo
        assert bad.status_code == 500 and bad.json()["error"]["type"] == "server_error"
        assert "injected fault" in bad.json()["error"]["message"]
        assert docs[-1]["error"]["message"] == "injected fault"  # the stream ends in an error
        assert pool_is_free(url)


def test_timeout_and_disconnect_abort_and_free(loaded):
    llm = LLM(loaded, kv_pool_tokens=4096)
    with in_process(llm.engine, request_timeout=1.0) as url:
        # A request over its timeout is aborted: 408, blocks freed.
        r = post(url, {"prompt": LONG, "max_tokens": 2000, "ignore_eos": True})
        assert r.status_code == 408 and r.json()["error"]["type"] == "timeout_error"
        assert pool_is_free(url)
        # A client that drops a plain request aborts it.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{url}/v1/completions",
                json={"model": "m", "prompt": LONG, "max_tokens": 500, "ignore_eos": True},
                timeout=httpx.Timeout(60, read=0.3),
            )
        end = time.monotonic() + 10
        while not pool_is_free(url) and time.monotonic() < end:
            time.sleep(0.05)
        assert pool_is_free(url)
        m = httpx.get(f"{url}/metrics").text
        assert metric(m, "ctxlab:request_success_total", finished_reason="abort") == 2


def test_a_full_queue_is_a_429_with_retry_after(loaded):
    llm = LLM(loaded, kv_pool_tokens=2048, max_num_seqs=1)
    with in_process(llm.engine, max_waiting=1) as url:
        # One running (max_num_seqs 1), one waiting (max_waiting 1): the third is a 429. Each
        # request is sent once the server's gauges show the one before it in place, so the
        # order holds however slow the machine is.
        async def until(c: httpx.AsyncClient, gauge: str) -> None:
            for _ in range(3000):
                if metric((await c.get(f"{url}/metrics")).text, gauge, model_name="m") == 1:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError(f"{gauge} never reached 1")

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=120) as c:
                body = {"model": "m", "prompt": LONG, "max_tokens": 6}
                long_run = {**body, "max_tokens": 48, "ignore_eos": True}
                first = asyncio.create_task(c.post(f"{url}/v1/completions", json=long_run))
                await until(c, "ctxlab:num_requests_running")
                second = asyncio.create_task(c.post(f"{url}/v1/completions", json=body))
                await until(c, "ctxlab:num_requests_waiting")
                third = await c.post(f"{url}/v1/completions", json=body)
                return [await first, await second, third]

        first, second, third = asyncio.run(burst())
        assert (first.status_code, second.status_code, third.status_code) == (200, 200, 429)
        assert third.headers["retry-after"] == "1"
        assert third.json()["error"]["type"] == "rate_limit_error"


def test_cache_salt_without_keys_and_vllm_metric_names(loaded):
    llm = LLM(loaded, kv_pool_tokens=2048)
    with in_process(llm.engine, metrics_prefix="vllm") as url:

        def cached(**salt: str) -> int:
            r = post(url, {"prompt": LONG, "max_tokens": 1, **salt})
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        assert cached(cache_salt="a") == 0
        assert cached(cache_salt="b") == 0
        assert cached(cache_salt="a") > 0 and cached() == 0
        text = httpx.get(f"{url}/metrics").text
        assert 'vllm:num_requests_running{model_name="m"}' in text
        assert metric(text, "vllm:request_success_total", finished_reason="length") == 4
        assert "ctxlab:kv_resident_bytes" in text  # ctxlab's own series keep their prefix


def test_half_of_64_streams_disconnect_on_a_tiny_pool_and_the_rest_finish(loaded):
    """64 streaming requests on a pool of about 10 % of their demand, every other client
    leaving after its first chunk: 32 finish with all 16 tokens, 32 are aborted, none
    errs, and every block is back in the pool (the second tour's fault case, kept)."""
    prompt = "A lighthouse keeper and a storm:"
    n_prompt = len(loaded.tokenizer.encode(prompt))
    demand = 64 * (-(-(n_prompt + 16) // 16) * 16)
    llm = LLM(loaded, kv_pool_tokens=max(64, demand // 10 // 16 * 16))
    usage = {"include_usage": True}
    body = {"model": "m", "prompt": prompt, "max_tokens": 16, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": usage}  # fmt: skip

    async def one(c: httpx.AsyncClient, url: str, leave: bool) -> tuple[int, str | None]:
        tokens, reason = 0, None
        async with c.stream("POST", f"{url}/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                assert "error" not in doc, doc
                if doc.get("usage"):
                    tokens = doc["usage"]["completion_tokens"]
                if doc.get("choices"):
                    reason = doc["choices"][0].get("finish_reason") or reason
                if leave:
                    return tokens, "left"
        return tokens, reason

    with in_process(llm.engine) as url:

        async def run() -> list[tuple[int, str | None]]:
            async with httpx.AsyncClient(timeout=120) as c:
                return await asyncio.gather(*(one(c, url, i % 2 == 1) for i in range(64)))

        results = asyncio.run(run())
        end = time.monotonic() + 20
        while not pool_is_free(url) and time.monotonic() < end:
            time.sleep(0.05)
        m = httpx.get(f"{url}/metrics").text
        assert pool_is_free(url)
        assert metric(m, "ctxlab:num_requests_running", model_name="m") == 0
    stayed = [r for i, r in enumerate(results) if i % 2 == 0]
    assert all(r == (16, "length") for r in stayed), stayed
    assert metric(m, "ctxlab:request_success_total", finished_reason="length") == 32
    assert metric(m, "ctxlab:request_success_total", finished_reason="abort") == 32
    assert metric(m, "ctxlab:request_success_total", finished_reason="error") == 0


def test_a_burst_larger_than_the_waiting_queue_is_admitted_when_it_fits(loaded):
    """An idle server with 2 running slots and 3 waiting places admits a 5-prompt request
    (the old rule counted all 5 as waiting and answered 429 forever), and a 6-prompt one
    can never fit, so it is a 400 that says so rather than a 429 to retry."""
    llm = LLM(loaded, kv_pool_tokens=2048, max_num_seqs=2)
    with in_process(llm.engine, max_waiting=3) as url:
        fits = post(url, {"prompt": ["One", "Two", "Three", "Four", "Five"], "max_tokens": 2})
        assert fits.status_code == 200, fits.text
        assert len(fits.json()["choices"]) == 5
        never = post(url, {"prompt": ["a", "b", "c", "d", "e", "f"], "max_tokens": 2})
        assert never.status_code == 400
        assert (
            "6 prompts, more than the server ever holds at once (2 running + 3 waiting)"
            in (never.json()["error"]["message"])
        )
