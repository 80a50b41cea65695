"""The seven demonstrations and the metrics each one reports: the names a config may use.

A prediction (`[predictions.<demo>.<metric>]`) and a required metric (`"<demo>.<metric>"`)
must name a metric listed here, so a typo is caught when the config is read, not after a
ten-minute run. Every metric compares two measured (or modeled) values of one quantity: a
baseline and an observed value, named here so the report can say what moved against what.
Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # "tokens", "ms", "bytes", "requests", "%", "USD", "blocks"
    baseline: str  # what the observed value is compared against
    observed: str
    description: str


@dataclass(frozen=True)
class Demo:
    number: int
    key: str  # the config section and the prefix of its metric names
    title: str
    metrics: tuple[Metric, ...]
    module: str  # ctxlab.workshop.<module> holds `run(ctx, cfg, tracker) -> DemoResult`

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)

    @property
    def metric_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.metrics)


def _m(name: str, unit: str, baseline: str, observed: str, description: str) -> Metric:
    return Metric(name, unit, baseline, observed, description)


_RESEND = "exact resend (warm)"
_D1 = (
    _m(
        "reused_tokens_at_token0",
        "tokens",
        _RESEND,
        "token 0 changed",
        "prompt tokens served by the prefix cache when the first token differs",
    ),
    _m(
        "reused_tokens_mid",
        "tokens",
        _RESEND,
        "middle token changed",
        "reused tokens when the token in the middle differs",
    ),
    _m(
        "reused_tokens_last_block",
        "tokens",
        _RESEND,
        "last-block token changed",
        "reused tokens when a token of the last block differs",
    ),
    _m(
        "recomputed_tokens_at_token0",
        "tokens",
        _RESEND,
        "token 0 changed",
        "prompt tokens computed again",
    ),
    _m(
        "recomputed_tokens_mid",
        "tokens",
        _RESEND,
        "middle token changed",
        "prompt tokens computed again",
    ),
    _m(
        "recomputed_tokens_last_block",
        "tokens",
        _RESEND,
        "last-block token changed",
        "prompt tokens computed again",
    ),
    _m("ttft_ms_at_token0", "ms", _RESEND, "token 0 changed", "time to first token"),
    _m("ttft_ms_mid", "ms", _RESEND, "middle token changed", "time to first token"),
    _m("ttft_ms_last_block", "ms", _RESEND, "last-block token changed", "time to first token"),
    _m(
        "reused_tokens_other_tenant",
        "tokens",
        _RESEND,
        "same prompt, other tenant's cache_salt",
        "reuse across an isolation key (must be none)",
    ),
)

_COLD, _WARM = "cold prefix (median)", "warm prefix (median)"
_D2 = (
    _m("ttft_ms", "ms", _COLD, _WARM, "time to first token"),
    _m("recomputed_tokens", "tokens", _COLD, _WARM, "prompt tokens computed"),
    _m("reused_tokens", "tokens", _COLD, _WARM, "prompt tokens served by the prefix cache"),
    _m("tpot_ms", "ms", _COLD, _WARM, "time per output token after the first"),
    _m("itl_ms", "ms", _COLD, _WARM, "median gap between consecutive output tokens"),
)

_SMALL, _LARGE = "smallest page size", "largest page size"
_D3 = (
    _m(
        "waste_tokens",
        "tokens",
        _SMALL,
        _LARGE,
        "page-rounding waste over the request set, measured from the pool",
    ),
    _m(
        "waste_tokens_vs_planner",
        "tokens",
        "planner's prediction (all page sizes)",
        "measured from the pool (all page sizes)",
        "total rounding waste",
    ),
    _m(
        "bytes_per_token_slot",
        "bytes",
        _SMALL,
        _LARGE,
        "pool bytes of one token slot over all layers and KV heads",
    ),
    _m(
        "reused_tokens_at_divergence",
        "tokens",
        _SMALL,
        _LARGE,
        "tokens reused by a prompt "
        "that diverges from a cached one at a position that is not a page multiple",
    ),
    _m(
        "reused_tokens_vs_planner",
        "tokens",
        "planner: full pages before the divergence (all page sizes)",
        "measured (all page sizes)",
        "reuse granularity",
    ),
    _m(
        "ttft_ms_after_divergence",
        "ms",
        _SMALL,
        _LARGE,
        "time to first token of the diverging prompt",
    ),
)

_GROUPED, _INTERLEAVED = "grouped arrivals (engine)", "interleaved arrivals (engine)"
_D4 = (
    _m("reused_tokens", "tokens", _GROUPED, _INTERLEAVED, "prompt tokens served by the cache"),
    _m(
        "recomputed_tokens",
        "tokens",
        _GROUPED,
        _INTERLEAVED,
        "prompt tokens computed although an earlier request had computed them",
    ),
    _m("evictions", "blocks", _GROUPED, _INTERLEAVED, "cached blocks evicted to make room"),
    _m("ttft_p50_ms", "ms", _GROUPED, _INTERLEAVED, "median time to first token"),
    _m("ttft_p95_ms", "ms", _GROUPED, _INTERLEAVED, "95th percentile time to first token"),
    _m("ttft_p99_ms", "ms", _GROUPED, _INTERLEAVED, "99th percentile time to first token"),
    _m(
        "sim_vs_engine_reused_tokens",
        "tokens",
        "engine, interleaved",
        "simulator, interleaved",
        "the simulator's reuse prediction on the same request list",
    ),
    _m(
        "sim_vs_engine_evictions",
        "blocks",
        "engine, interleaved",
        "simulator, interleaved",
        "the simulator's eviction prediction",
    ),
    _m(
        "sim_vs_engine_ttft_p50_ms",
        "ms",
        "engine, interleaved",
        "simulator, interleaved",
        "the simulator's median TTFT prediction",
    ),
)

_TRUNC, _TIERED = "truncation", "tiered memory with an archive"
_D5 = (
    _m(
        "facts_in_context", "facts", _TRUNC, _TIERED, "planted facts still in the compacted context"
    ),
    _m(
        "facts_recoverable",
        "facts",
        _TRUNC,
        _TIERED,
        "planted facts out of the context that a search of the message log brings back",
    ),
    _m("facts_lost", "facts", _TRUNC, _TIERED, "planted facts neither in context nor found"),
    _m(
        "facts_in_prompt",
        "facts",
        _TRUNC,
        _TIERED,
        "planted facts whose answer is in the prompt the strategy builds for the fact's question",
    ),
    _m("answer_accuracy_pct", "%", _TRUNC, _TIERED, "accuracy on the facts' questions"),
    _m("context_tokens", "tokens", _TRUNC, _TIERED, "tokens in the compacted context"),
)

_KMIN, _KMAX = "smallest k", "largest k"
_D6 = (
    _m("recall_at_k_pct", "%", _KMIN, _KMAX, "evidence sentences found in the top k"),
    _m("citation_precision_pct", "%", _KMIN, _KMAX, "cited chunks that are gold"),
    _m("citation_recall_pct", "%", _KMIN, _KMAX, "gold chunks that are cited"),
    _m("answer_accuracy_pct", "%", _KMIN, _KMAX, "answers matching the gold answer"),
    _m(
        "context_tokens_per_question",
        "tokens",
        _KMIN,
        _KMAX,
        "tokens the retrieved passages add to the prompt",
    ),
    _m("cost_per_question_usd", "USD", _KMIN, _KMAX, "hosted price of one question"),
)

_KV, _REC = "KV-heavy architecture", "fixed-recurrent-state architecture"
_D7 = (
    _m("bytes_per_request", "bytes", _KV, _REC, "cache bytes of one short request (plan)"),
    _m(
        "concurrency_reached",
        "requests",
        _KV,
        _REC,
        "most requests running at once, short workload at equal memory (simulated)",
    ),
    _m("ttft_p99_ms", "ms", _KV, _REC, "p99 TTFT, short workload at equal memory (simulated)"),
    _m(
        "engine_concurrency_reached",
        "requests",
        "long requests (engine)",
        "short requests (engine)",
        "most requests running at once on the real engine's pool",
    ),
    _m(
        "engine_bytes_per_request",
        "bytes",
        "long requests (engine)",
        "short requests (engine)",
        "resident cache bytes per request, measured from the pool",
    ),
    _m(
        "engine_ttft_p99_ms",
        "ms",
        "long requests (engine)",
        "short requests (engine)",
        "p99 TTFT on the real engine",
    ),
)

_COLO, _SPLIT = "colocated (one process)", "disaggregated (prefill and decode processes)"
_D9 = (
    _m(
        "resident_extra_mib",
        "MiB",
        _COLO,
        _SPLIT,
        "resident memory of the second process (its copy of the weights, its pool, runtime)",
    ),
    _m("kv_bytes_per_request", "bytes", _COLO, _SPLIT, "KV bytes moved per long prompt"),
    _m(
        "transfer_ms_per_request",
        "ms",
        _COLO,
        _SPLIT,
        "milliseconds from a long prompt's first KV page to its last",
    ),
    _m("ttft_p50_ms", "ms", _COLO, _SPLIT, "p50 TTFT over every request"),
    _m(
        "itl_p99_busy_ms",
        "ms",
        _COLO,
        _SPLIT,
        "p99 gap between tokens of running decodes while a long prompt is prefilled",
    ),
    _m("tpot_p50_ms", "ms", _COLO, _SPLIT, "p50 time per output token"),
    _m(
        "sim_vs_measured_ttft_p50_ms",
        "ms",
        "measured (disaggregated)",
        "simulated (disaggregated)",
        "p50 TTFT the simulator predicts for the same requests from a measured profile",
    ),
)

DEMOS: tuple[Demo, ...] = (
    Demo(1, "prefix_miss", "Change one early token", _D1, "demo_prefix_miss"),
    Demo(
        2,
        "warm_prefix",
        "TTFT and inter-token latency after a warm prefix",
        _D2,
        "demo_warm_prefix",
    ),
    Demo(3, "page_size", "Page size: rounding waste and reuse granularity", _D3, "demo_page_size"),
    Demo(4, "eviction", "Forced eviction with interleaved prefixes", _D4, "demo_eviction"),
    Demo(
        5, "compaction", "Compact a history: what cannot be reconstructed", _D5, "demo_compaction"
    ),
    Demo(6, "retrieval_depth", "Retrieval depth k", _D6, "demo_retrieval_depth"),
    Demo(
        7,
        "recurrent_vs_kv",
        "Fixed recurrent state against a KV-heavy cache at equal memory",
        _D7,
        "demo_recurrent",
    ),
    Demo(9, "disaggregation", "Prefill and decode in two processes", _D9, "demo_disagg"),
)

BY_KEY: dict[str, Demo] = {d.key: d for d in DEMOS}
BY_NUMBER: dict[int, Demo] = {d.number: d for d in DEMOS}


def metric_ref(ref: str) -> tuple[Demo, Metric] | str:
    """`"demo.metric"` -> (demo, metric), or why it names nothing (a sentence fragment)."""
    key, dot, name = ref.partition(".")
    if not dot:
        return f"{ref!r} is not of the form demonstration.metric"
    demo = BY_KEY.get(key)
    if demo is None:
        return f"{key!r} is not a demonstration (known: {', '.join(BY_KEY)})"
    metric = demo.metric(name)
    if metric is None:
        return f"{name!r} is not a metric of {key} (known: {', '.join(demo.metric_names)})"
    return demo, metric
