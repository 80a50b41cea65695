"""Prometheus series of the prefix cache's offload tier (`ctxlab.kv.prefix_offload`).

vLLM's names where vLLM has them, under the server's prefix: `external_prefix_cache_queries`
and `_hits` (tokens looked up in and restored from the tier), `kv_offload_store_bytes`,
`kv_offload_load_bytes` and `kv_offload_load_time` (seconds, queue wait included). What vLLM
does not have, under `ctxlab:`: restore failures by kind (each one recomputed its tokens)
and the transfer queue's wait, a histogram per direction.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from ctxlab.kv.prefix_offload import PrefixOffload
from ctxlab.kv.transfer_queue import LOAD, STORE

WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                2.5, 5.0)  # fmt: skip
KINDS = ("missing", "checksum", "io")


class OffloadMetrics:
    def __init__(self, registry: CollectorRegistry, prefix: str, model_name: str):
        label = ["model_name"]

        def counter(name: str, doc: str, pre: str = prefix) -> Counter:
            return Counter(f"{pre}:{name}", doc, label, registry=registry).labels(model_name)

        self.queries = counter(
            "external_prefix_cache_queries", "Tokens looked up in the offload tier."
        )
        self.hits = counter("external_prefix_cache_hits", "Tokens restored from the offload tier.")
        self.store_bytes = counter("kv_offload_store_bytes", "KV bytes stored to the tier.")
        self.load_bytes = counter("kv_offload_load_bytes", "KV bytes restored from the tier.")
        self.load_time = counter("kv_offload_load_time", "Seconds restores took (wait included).")
        failures = Counter(
            "ctxlab:kv_offload_restore_failures",
            "Restores that failed (their tokens were recomputed), by kind.",
            ["model_name", "kind"],
            registry=registry,
        )
        self.failures = {k: failures.labels(model_name, k) for k in KINDS}
        wait = Histogram(
            "ctxlab:kv_offload_queue_wait_seconds",
            "Time a transfer waited in the offload queue, by direction.",
            ["model_name", "direction"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.wait = {d: wait.labels(model_name, d) for d in (STORE, LOAD)}
        self._last: dict[str, float] = {}

    def _delta(self, key: str, value: float) -> float:
        before = self._last.get(key, 0)
        self._last[key] = value
        return max(0, value - before)

    def observe(self, off: PrefixOffload) -> None:
        """Move every series to the tier's cumulative counts (called after each step)."""
        st = off.stats()
        self.queries.inc(self._delta("q", st.external_prefix_cache_queries))
        self.hits.inc(self._delta("h", st.external_prefix_cache_hits))
        self.store_bytes.inc(self._delta("s", st.kv_offload_store_bytes))
        self.load_bytes.inc(self._delta("l", st.kv_offload_load_bytes))
        self.load_time.inc(self._delta("t", st.kv_offload_load_time))
        for kind, hist in self.failures.items():
            hist.inc(self._delta(f"f{kind}", st.restore_failures.get(kind, 0)))
        for d, hist in self.wait.items():
            waits = off.transfers.waits[d]
            seen = int(self._last.get(f"w{d}", 0))
            for w in waits[seen : len(waits)]:
                hist.observe(w)
            self._last[f"w{d}"] = seen + len(waits[seen : len(waits)])
