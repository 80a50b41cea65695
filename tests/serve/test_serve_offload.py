"""The offload tier through the server: a prefix evicted from a small pool comes back from
host memory on the next request (same text), and /metrics says so under vLLM's names."""

from __future__ import annotations

import httpx
import pytest

from ctxlab.engine import LLM
from tests.serve.conftest import in_process, metric

pytestmark = pytest.mark.model

TOPICS = ("lighthouses", "glaciers", "printing presses")


def test_evicted_prefix_is_restored_and_counted(loaded):
    llm = LLM(loaded, kv_pool_tokens=256, max_num_seqs=1)
    llm.engine.attach_offload(64 << 20)
    prompts = [f"Write three careful sentences about {t}. " * 16 for t in TOPICS]
    n = [len(loaded.tokenizer.encode(p)) for p in prompts]
    assert all(100 < x < 200 for x in n)  # each prompt needs most of the 256-token pool
    with in_process(llm.engine, metrics_prefix="vllm") as url:

        def ask(p: str) -> tuple[str, int]:
            r = httpx.post(
                f"{url}/v1/completions",
                json={"model": "m", "prompt": p, "max_tokens": 4, "temperature": 0},
                timeout=120,
            )
            doc = r.json()
            return doc["choices"][0]["text"], doc["usage"]["prompt_tokens_details"]["cached_tokens"]

        first = [ask(p) for p in prompts]
        again = ask(prompts[0])  # evicted by the two after it: restored from host memory
        text = httpx.get(f"{url}/metrics").text
    assert again[0] == first[0][0]
    assert again[1] > 0 and first[0][1] == 0
    assert metric(text, "vllm:external_prefix_cache_hits_total") == again[1]
    assert metric(text, "vllm:kv_offload_load_bytes_total") > 0
    assert metric(text, "vllm:kv_offload_store_bytes_total") > 0
    assert metric(text, "ctxlab:kv_offload_queue_wait_seconds_count", direction="load") == 1
    assert metric(text, "ctxlab:kv_offload_restore_failures_total", kind="missing") == 0
