"""How many requests a server ran at once, read from its own gauge while a workload runs.

A client sees when each of its requests started and ended, not whether the server ran them
together or queued some: a server with two slots answers eight requests sent at once, only
later. vLLM publishes `vllm:num_requests_running` (the requests in its running batch; `ctxlab
serve` publishes the same name), SGLang `sglang:num_running_reqs` and llama.cpp
`llamacpp:requests_processing`. `RunningSampler` reads that gauge from `/metrics` every few
tens of milliseconds on its own thread while the workload runs and keeps the largest value
seen: a lower bound on the true peak (a batch that lasted less than one interval can be
missed), which the report says. A server without the gauge gives None, and the figure stays
"not measurable" with that reason.
"""

from __future__ import annotations

import math
import threading
from types import TracebackType

from ctxlab.probe.client import ProbeClient
from ctxlab.probe.metrics import parse

# the gauge's name on each server (the part after the prefix for vLLM's, which `ctxlab serve`
# can publish under another prefix)
RUNNING_GAUGES = ("num_requests_running", "num_running_reqs", "requests_processing")
INTERVAL_S = 0.02


def running_now(samples: list[tuple[str, dict[str, str], float]]) -> float | None:
    """The running-requests gauge's value (summed over its series: vLLM labels one per
    model), or None where the metrics have no such gauge or it is not a count."""
    values = [v for n, _labels, v in samples if n.split(":")[-1] in RUNNING_GAUGES]
    if not values or not all(math.isfinite(v) and v >= 0 for v in values):
        return None
    return math.fsum(values)


class RunningSampler:
    """`with RunningSampler(client) as s: ...` samples the gauge until the block ends;
    `s.peak` is the largest value read (None: no gauge)."""

    def __init__(self, client: ProbeClient, interval_s: float = INTERVAL_S) -> None:
        self.client = client
        self.interval_s = interval_s
        self.peak: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="running-sampler", daemon=True)

    def __enter__(self) -> RunningSampler:
        self._read()  # one read before the workload: a server without the gauge stops here
        if self.peak is not None:
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def _read(self) -> None:
        reply = self.client.get("/metrics", cap=2.0)
        if reply is None or reply.status_code != 200:
            return
        value = running_now(parse(reply.text))
        if value is not None:
            self.peak = value if self.peak is None else max(self.peak, value)
