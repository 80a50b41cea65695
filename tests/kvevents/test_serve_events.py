"""`ctxlab serve` publishes its prefix cache's stores and removals in vLLM's KV-event format:
a subscriber decodes them, and what they say matches the engine's own cache counters and
the cached tokens each response reported."""

from __future__ import annotations

import time

import httpx
import pytest

from ctxlab.engine import LLM
from ctxlab.kvevents.events import BlockStored
from ctxlab.kvevents.residency import Request, Residency
from ctxlab.kvevents.subscriber import Subscriber
from tests.kvevents.test_events import free_port
from tests.serve.conftest import in_process

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]

BS = 16
PREFIX = list(range(1000, 1000 + 2 * BS + 5))  # two full pages and a bit


def test_serve_publishes_what_its_prefix_cache_did(loaded):
    llm = LLM(loaded, kv_pool_tokens=8 * BS, block_size=BS, max_num_seqs=1)
    ep, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    prompts = [
        [*PREFIX, 7, 8, 9],
        [*PREFIX, 17, 18, 19, 20],  # shares the prefix's two full pages
        list(range(2000, 2000 + 6 * BS)),  # fills the pool: the cached prefix is evicted
        [*PREFIX, 7, 8, 9],  # evicted: computed again
    ]
    sent: list[tuple[float, int]] = []
    with (
        in_process(llm.engine, kv_events=ep, kv_events_replay=rep) as url,
        Subscriber(ep, replay_endpoint=rep, expect_from=0) as sub,
    ):
        time.sleep(0.5)  # the subscription reaches the PUB socket (a late one is replayed)
        for p in prompts:
            at = time.time()
            r = httpx.post(
                f"{url}/v1/completions",
                json={"model": "m", "prompt": p, "max_tokens": 2, "temperature": 0},
                timeout=120,
            )
            assert r.status_code == 200, r.text
            sent.append((at, r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]))
        stats = llm.engine.kv.stats()
        end = time.monotonic() + 10
        while time.monotonic() < end:
            sub.poll(0.2)
            r = Residency().feed_all(x.batch for x in sub.batches)
            if r.removed_total >= stats.cached_blocks_evicted and len(r.resident) == (
                stats.blocks_cached
            ):
                break
    assert sub.gaps == [] or all(g.missing == 0 for g in sub.gaps)
    assert sub.bad_messages == 0 and sub.unknown_events == 0
    batches = [x.batch for x in sub.batches]
    stored = [e for b in batches for e in b.events if isinstance(e, BlockStored)]
    # the first store is the prompt's first two pages, with its very tokens
    assert stored[0].parent is None and stored[0].block_size == BS
    assert stored[0].token_ids == tuple(PREFIX[: 2 * BS])
    res = Residency().feed_all(batches)
    # the events and the engine's own counters tell the same story
    assert stats.cached_blocks_evicted > 0
    assert len(res.evictions) == stats.cached_blocks_evicted
    assert len(res.resident) == stats.blocks_cached
    assert res.first is not None and res.first.resident_blocks <= 8
    # and each response's cached tokens are what the events say was resident when it came
    whys = [res.explain(Request(at, tuple(p))) for (at, _), p in zip(sent, prompts, strict=True)]
    assert [w.hit_blocks * BS for w in whys] == [cached for _, cached in sent]
    assert [w.reason for w in whys] == ["never stored", "hit", "never stored", "evicted"]


def test_blocks_restored_from_the_offload_tier_are_stored_again(loaded):
    """A prefix evicted to host memory and restored is in the map again: the stream says
    so, so every later removal names a block it stored and the counts still agree."""
    llm = LLM(loaded, kv_pool_tokens=16 * BS, block_size=BS, max_num_seqs=1)
    llm.engine.attach_offload(64 << 20)
    ep = f"tcp://127.0.0.1:{free_port()}"
    prompts = [list(range(3000 + 500 * i, 3000 + 500 * i + 10 * BS)) for i in range(3)]
    with in_process(llm.engine, kv_events=ep) as url, Subscriber(ep) as sub:
        time.sleep(0.5)
        for p in [*prompts, prompts[0], prompts[1]]:
            r = httpx.post(
                f"{url}/v1/completions",
                json={"model": "m", "prompt": p, "max_tokens": 2, "temperature": 0},
                timeout=120,
            )
            assert r.status_code == 200, r.text
        stats = llm.engine.kv.stats()
        end = time.monotonic() + 10
        while time.monotonic() < end:
            sub.poll(0.2)
            res = Residency().feed_all(x.batch for x in sub.batches)
            if len(res.evictions) >= stats.cached_blocks_evicted:
                break
    assert llm.engine.offload is not None and llm.engine.offload.restored_blocks > 0
    assert res.removed_unknown == 0
    assert len(res.evictions) == stats.cached_blocks_evicted
    assert len(res.resident) == stats.blocks_cached
    assert len(res.reuse_gaps) >= llm.engine.offload.restored_blocks
