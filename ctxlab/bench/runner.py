"""Send a workload at its arrival times and collect what each request measured.

Arrivals as `vllm bench serve`: with `--request-rate inf` everything is sent at once;
otherwise the gaps are gamma-distributed with shape = burstiness and mean 1/rate (burstiness
1 is a Poisson process; below 1 burstier, above 1 more regular), from a seeded generator. A
trace keeps its own timestamps. `--max-concurrency` caps requests in flight: a request that
arrives while the cap is reached waits for a slot (its TTFT starts when it is sent, as in
vLLM). The turns of a conversation are sent one after another, each with the history so far
(the server's real answers), so a prefix cache can reuse every earlier turn.

Ctrl-C (or any cancellation) stops sending; the requests that finished are returned and the
run is marked interrupted.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np

from ctxlab.bench.client import TIMED_OUT, Endpoint, send
from ctxlab.bench.metrics import RequestResult
from ctxlab.bench.workloads import MAX_REPLAY_S, BenchRequest, duration
from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_positive


@dataclass
class RunResult:
    results: list[RequestResult]  # finished requests, each turn of a conversation its own
    duration: float
    interrupted: bool


def arrival_times(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds from the start for n arrivals (the first at 0)."""
    if not rate > 0:
        raise CtxlabError(f"--request-rate must be positive (or inf), got {rate}.")
    if not burstiness > 0:
        raise CtxlabError(f"--burstiness must be positive, got {burstiness}.")
    if math.isinf(rate):
        return [0.0] * n
    if n <= 1:
        return [0.0] * n
    scale = 1.0 / rate / burstiness  # (rate * burstiness can underflow to 0)
    rng = np.random.default_rng([seed, 5])
    gaps = rng.gamma(shape=burstiness, scale=scale, size=n - 1) if math.isfinite(scale) else []
    times = [0.0, *np.cumsum(gaps).tolist()] if math.isfinite(scale) else [0.0, math.inf]
    if not times[-1] <= MAX_REPLAY_S:  # the trace replay's bound (inf and nan too)
        # a rate of 1e-300 waited 1e300 s for its second request; say so before the clock
        shown = duration(times[-1]) if math.isfinite(times[-1]) else "forever"
        raise CtxlabError(
            f"--request-rate {rate:g} (burstiness {burstiness:g}) spreads {n:,} requests over "
            f"{shown}, past the {duration(MAX_REPLAY_S)} a run may wait; give a rate of at "
            f"least about {max(n - 1, 1) / MAX_REPLAY_S:.3g} per second, or fewer --num-prompts."
        )
    return times


PROBE_TIMEOUT_S = 60.0  # the test request asks for one token; a live server answers sooner


async def check_server(
    client: httpx.AsyncClient, ep: Endpoint, first: BenchRequest, timeout: float
) -> None:
    """One request with one output token before the clock starts (as `vllm bench serve`'s
    initial test run), so a wrong URL, model or key is one sentence, not N failures.

    Its prompt is as long as the first request's, because a server may refuse a toy one (a KV
    policy whose budget needs a longer prompt), but it starts with a word of its own: the
    first request then finds none of its blocks cached by the probe, and its TTFT and cached
    tokens are its own (vLLM's test run sends the first prompt itself and warms the cache).
    It waits at most `PROBE_TIMEOUT_S` (or `timeout`, when shorter), so a server that accepts
    and never answers is one sentence within a minute, not a silent wait."""
    probe = RequestResult(index=-1, prompt_len=first.prompt_len)
    words = first.prompt.split(" ")
    text = " ".join(["Ping", *words[:-1]]) if len(words) > 1 else f"Ping {first.prompt}"
    prompt = [{"role": "user", "content": text}] if first.turns else text
    wait = min(timeout, PROBE_TIMEOUT_S)
    await send(client, ep, prompt, 1, probe, time.perf_counter(), timeout=wait)
    if probe.error.startswith(TIMED_OUT):
        raise CtxlabError(
            f"the server at {ep.shown} accepted the test request but sent nothing for {wait:g} s "
            "(or no complete answer within that total deadline); is it stuck or overloaded?"
        )
    if not probe.success:
        raise CtxlabError(f"the server at {ep.shown} did not answer a test request: {probe.error}")


async def run(
    ep: Endpoint,
    requests: list[BenchRequest],
    arrivals: list[float],
    max_concurrency: int | None,
    timeout: float,
    on_done: Callable[[RequestResult], None] | None = None,
) -> RunResult:
    """Send every request (each conversation's turns in order) at its arrival time."""
    if max_concurrency is not None and max_concurrency < 1:
        raise CtxlabError(f"--max-concurrency must be at least 1, got {max_concurrency}.")
    check_positive(timeout, "--timeout")
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    tmo = httpx.Timeout(timeout, connect=min(30.0, timeout))
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    done: list[RequestResult] = []
    async with httpx.AsyncClient(limits=limits, timeout=tmo) as client:
        if requests:
            await check_server(client, ep, requests[0], timeout)
        t0 = time.perf_counter()

        async def one(prompt, max_tokens: int, res: RequestResult) -> RequestResult:
            if slots is None:
                await send(client, ep, prompt, max_tokens, res, t0)
            else:
                async with slots:
                    await send(client, ep, prompt, max_tokens, res, t0)
            done.append(res)
            if on_done is not None:
                on_done(res)
            return res

        async def conversation(req: BenchRequest, first_index: int) -> None:
            history: list[dict[str, str]] = []
            for k, user in enumerate([req.prompt, *req.turns]):
                history.append({"role": "user", "content": user})
                res = RequestResult(index=first_index + k, prompt_len=req.prompt_len * (k + 1))
                await one(list(history), req.output_len, res)
                if not res.success:
                    return
                history.append({"role": "assistant", "content": res.text})

        tasks: list[asyncio.Task] = []
        index = 0
        try:
            for req, at in zip(requests, arrivals, strict=True):
                delay = t0 + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if req.turns:
                    tasks.append(asyncio.create_task(conversation(req, index)))
                    index += 1 + len(req.turns)
                else:
                    res = RequestResult(index=index, prompt_len=req.prompt_len)
                    tasks.append(asyncio.create_task(one(req.prompt, req.output_len, res)))
                    index += 1
            await asyncio.gather(*tasks)
            end = time.perf_counter()
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return RunResult(_finished(done), time.perf_counter() - t0, True)
    return RunResult(_finished(done), end - t0, False)


def _finished(done: list[RequestResult]) -> list[RequestResult]:
    """Results in request order; an interrupted request (no answer, no error) is dropped."""
    return sorted((r for r in done if r.success or r.error), key=lambda r: r.index)
