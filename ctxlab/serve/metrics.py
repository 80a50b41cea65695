"""Prometheus metrics under vLLM's names, plus what a KV policy changes.

Names are vLLM's (V1) with the prefix `ctxlab:` by default, or `vllm:` (`--metrics-prefix
vllm`) so dashboards built for vLLM read a ctxlab server unchanged; every series carries a
`model_name` label. Counters follow vLLM's units: prefix-cache queries and hits count
tokens (not requests), `request_success` counts finished requests by `finished_reason`
(stop, length, abort, error). The histogram buckets are vLLM's.

What vLLM does not have, always under `ctxlab:`: the bytes of KV blocks in use (measured
from the pool, so a retention policy's savings show here), the pool's size and free blocks,
the KV bytes a policy had dropped from each finished request (full-cache blocks of its
computed tokens minus the blocks it held at its end), and the bytes a recall policy moved
to and back from its far tier. The prefix cache's offload tier, when the engine has one, adds
its series (`ctxlab.serve.offload_metrics`, vLLM's names where vLLM has them).
`cache_config_info` carries vLLM's labels (`block_size`,
`num_gpu_blocks`: pages per layer and head, `enable_prefix_caching`, `cache_dtype`).

Everything is written by the engine thread (prometheus_client is thread-safe) and read by
`GET /metrics`.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)

from ctxlab.engine.llm_engine import LLMEngine
from ctxlab.engine.request import RequestOutput
from ctxlab.engine.sequence import Sequence
from ctxlab.kv.layout import KVLayout

PREFIXES = ("ctxlab", "vllm")
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error")


class ServeMetrics:
    def __init__(self, model_name: str, prefix: str = "ctxlab"):
        if prefix not in PREFIXES:
            raise ValueError(f"metrics prefix must be one of {PREFIXES}")
        disable_created_metrics()  # no `_created` series beside each counter (as vLLM)
        self.registry = CollectorRegistry()
        self.model_name = model_name
        p, reg, label = prefix, self.registry, ["model_name"]

        def gauge(name: str, doc: str, pre: str = p) -> Any:
            return Gauge(f"{pre}:{name}", doc, label, registry=reg).labels(model_name)

        def counter(name: str, doc: str, pre: str = p) -> Any:
            return Counter(f"{pre}:{name}", doc, label, registry=reg).labels(model_name)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            h = Histogram(f"{p}:{name}", doc, label, buckets=buckets, registry=reg)
            return h.labels(model_name)

        self.running = gauge("num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be admitted.")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.")
        self.prefix_queries = counter(
            "prefix_cache_queries", "Prefix-cache queries, in tokens (prompt tokens looked up)."
        )
        self.prefix_hits = counter("prefix_cache_hits", "Prefix-cache hits, in tokens.")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.preemptions = counter("num_preemptions", "Preemptions (recompute) of requests.")
        success = Counter(
            f"{p}:request_success",
            "Finished requests by finished_reason.",
            ["model_name", "finished_reason"],
            registry=reg,
        )
        self.success = {r: success.labels(model_name, r) for r in FINISH_REASONS}
        self.ttft = hist("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Gaps between tokens.", TOKEN_BUCKETS)
        self.tpot = hist(
            "request_time_per_output_token_seconds",
            "Per request: (latency - TTFT) / (output tokens - 1).",
            TOKEN_BUCKETS,
        )
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS)
        c = "ctxlab"
        self.resident = gauge("kv_resident_bytes", "Bytes of KV blocks in use (measured).", c)
        self.pool_bytes = gauge("kv_pool_bytes", "Bytes of the KV pool.", c)
        self.blocks_free = gauge("kv_blocks_free", "Free KV blocks (cached ones included).", c)
        self.blocks_total = gauge("kv_blocks_total", "KV blocks in the pool.", c)
        self.evicted = counter(
            "kv_policy_evicted_bytes",
            "KV bytes a retention policy had dropped from finished requests.",
            c,
        )
        self.offloaded = counter("kv_offloaded_bytes", "KV bytes moved to a far tier.", c)
        self.recalled = counter("kv_recalled_bytes", "KV bytes recalled from a far tier.", c)
        self.step_failures = counter("step_failures", "Engine steps that raised.", c)
        self._last: dict[str, int] = {}
        self._tier: Any = None
        self._offload: Any = None  # OffloadMetrics, made when an engine has the tier
        self._prefix = p
        self.cache_config = Info(
            f"{p}:cache_config", "Information of the cache config.", registry=reg
        )

    def describe_cache(self, engine: LLMEngine) -> None:
        """vLLM's `cache_config_info`: the page (block) size and how many pages one layer's
        pool holds, so capacity in tokens is num_gpu_blocks x block_size (as on vLLM)."""
        kv = engine.kv
        self.cache_config.info({
            "block_size": str(kv.block_size),
            "num_gpu_blocks": str(kv.pool_tokens // kv.block_size),
            "enable_prefix_caching": str(bool(kv.enable_prefix_caching)),
            "cache_dtype": cache_dtype_name(kv.kv_format, kv.layout),
        })  # fmt: skip
        if getattr(engine, "offload", None) is not None:  # its series show from the start
            self._offload_series()

    def _offload_series(self) -> Any:
        if self._offload is None:
            from ctxlab.serve.offload_metrics import OffloadMetrics

            self._offload = OffloadMetrics(self.registry, self._prefix, self.model_name)
        return self._offload

    def _delta(self, key: str, value: int) -> int:
        """How far a cumulative engine count moved since the last look (never negative)."""
        before = self._last.get(key, 0)
        self._last[key] = value
        return max(0, value - before)

    def observe_engine(self, engine: LLMEngine) -> None:
        """Gauges and the engine's cumulative counts; called after every step."""
        st = engine.stats()
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting)
        self.kv_usage.set(st.blocks_used / st.blocks_total if st.blocks_total else 0.0)
        self.resident.set(st.resident_bytes)
        self.pool_bytes.set(st.pool_bytes)
        self.blocks_free.set(st.blocks_free)
        self.blocks_total.set(st.blocks_total)
        self.prefix_queries.inc(self._delta("queries", st.prefix_cache_queries))
        self.prefix_hits.inc(self._delta("hits", st.prefix_cache_hits))
        self.preemptions.inc(self._delta("preemptions", engine.num_preemptions))
        self.step_failures.inc(self._delta("failures", engine.num_failed_steps))
        offload = getattr(engine, "offload", None)  # the prefix cache's offload tier
        if offload is not None:
            self._offload_series().observe(offload)
        far = getattr(engine.runtime, "far", None)  # a recall policy's far reads, if any
        tier = getattr(far, "tier", None)
        if tier is not None:
            if tier is not self._tier:  # a rebuilt runtime starts a new tier at zero
                self._tier = tier
                self._last["out"] = self._last["in"] = 0
            self.offloaded.inc(self._delta("out", int(tier.bytes_out)))
            self.recalled.inc(self._delta("in", int(tier.bytes_in)))

    def observe_finished(self, out: RequestOutput, seq: Sequence, engine: LLMEngine) -> None:
        """Latency histograms, the finish reason and the policy's dropped bytes of a request."""
        m = out.metrics
        reason = out.finish_reason if out.finish_reason in FINISH_REASONS else "abort"
        self.success[reason].inc()
        if m.first_token_time is not None:
            self.ttft.observe(m.ttft)
        for gap in m.itl:
            self.itl.observe(gap)
        if reason in ("stop", "length"):
            self.e2e.observe(m.latency)
            if m.output_tokens > 1:
                self.tpot.observe(m.tpot)
        kv = engine.kv
        if engine.policy is not None and engine.policy.evicts and kv.pool.block_bytes:
            full_blocks = -(-seq.num_computed // kv.block_size) * kv.n_lanes
            held_blocks = m.resident_kv_bytes // kv.pool.block_bytes
            self.evicted.inc(max(0, full_blocks - held_blocks) * kv.pool.block_bytes)


def cache_dtype_name(kv_format: str | None, layout: KVLayout) -> str:
    """vLLM's `cache_dtype` label: the codes' format, "bfloat16" for a bf16 cache beside a
    float32 model, else "auto" (the model's dtype)."""
    if kv_format is not None:
        return kv_format
    if layout.compute_dtype is not None:
        return str(layout.dtype).removeprefix("torch.")
    return "auto"
