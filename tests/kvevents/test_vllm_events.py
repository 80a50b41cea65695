"""vLLM's own KV events, read by ctxlab's subscriber: two requests sharing a two-page prefix,
and BlockStored events carrying that prefix's very token ids; the second request's cached
tokens are what the events say was resident when it was sent."""

from __future__ import annotations

import time

import httpx
import pytest

from ctxlab.kvevents.events import BlockStored
from ctxlab.kvevents.residency import Request, Residency
from ctxlab.kvevents.subscriber import Subscriber
from tests.vllm_server import VLLM, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.server, pytest.mark.xdist_group(VLLM)]


def test_vllm_block_stored_carries_the_prompt_tokens(vllm_server: VllmServer):
    if vllm_server.kv_events is None:
        pytest.skip("this vLLM server was started by hand, without --kv-events-config")
    bs = vllm_server.block_size
    base = 20_000 + int(time.time()) % 5_000  # a prefix no earlier request stored
    prefix = list(range(base, base + 2 * bs))
    prompts = [[*prefix, 11, 12, 13], [*prefix, 21, 22, 23, 24]]
    sent: list[tuple[float, int]] = []
    with Subscriber(vllm_server.kv_events) as sub:
        time.sleep(1.0)  # the subscription reaches vLLM's PUB socket
        for p in prompts:
            at = time.time()
            r = httpx.post(
                f"{vllm_server.url}/v1/completions",
                json={"model": vllm_server.model, "prompt": p, "max_tokens": 1, "temperature": 0},
                timeout=300,
            )
            assert r.status_code == 200, r.text
            sent.append((at, r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]))
        end = time.monotonic() + 20
        stored: list[BlockStored] = []
        while time.monotonic() < end and not any(
            e.token_ids[: 2 * bs] == tuple(prefix) for e in stored
        ):
            sub.poll(0.5)
            stored = [e for x in sub.batches for e in x.batch.events if isinstance(e, BlockStored)]
    ours = [e for e in stored if e.token_ids[: 2 * bs] == tuple(prefix)]
    assert ours, f"no BlockStored with the prompt's tokens among {len(stored)} stores"
    assert ours[0].block_size == bs and ours[0].parent is None
    assert len(ours[0].block_hashes) == 2  # two full pages; the third is partial
    assert sub.bad_messages == 0
    res = Residency().feed_all(x.batch for x in sub.batches)
    second = res.explain(Request(sent[1][0], tuple(prompts[1])))
    assert sent[1][1] == 2 * bs and (second.reason, second.hit_blocks) == ("hit", 2)
