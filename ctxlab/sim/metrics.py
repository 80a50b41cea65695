"""Latency percentiles, throughput, goodput and the token accounting of a run.

Percentiles interpolate linearly between order statistics (numpy's default "linear"
method, the same as `numpy.percentile`): p of n sorted values sits at rank p/100 x (n-1).
TTFT = first token - arrival; TPOT = (end-to-end - TTFT) / (output tokens - 1), for requests
with more than one output token; ITL = every gap between consecutive tokens of a request;
queueing = first admission - arrival. Goodput counts requests meeting both SLOs, per second.
"""

from __future__ import annotations

import numpy as np

PERCENTILES = (50, 95, 99)


def percentile(values: np.ndarray | list[float], p: float) -> float:
    """Linear-interpolated percentile; NaN for no values."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return float("nan")
    return float(np.percentile(arr, p, method="linear"))


def latency_block(name: str, values: np.ndarray) -> dict[str, float]:
    out = {f"{name}_p{p}": percentile(values, p) for p in PERCENTILES}
    out[f"{name}_mean"] = float(values.mean()) if values.size else float("nan")
    return out


def summarize(
    arrival: np.ndarray,
    first_token: np.ndarray,
    finish: np.ndarray,
    admitted: np.ndarray,
    outputs: np.ndarray,
    itl: np.ndarray,
    slo_ttft: float,
    slo_tpot: float,
) -> dict[str, float]:
    """Per-request arrays (seconds) to the latency and rate figures of a run."""
    ttft = first_token - arrival
    e2e = finish - arrival
    multi = outputs > 1
    tpot = np.where(multi, (e2e - ttft) / np.maximum(outputs - 1, 1), 0.0)
    queue = admitted - arrival
    out: dict[str, float] = {}
    out.update(latency_block("ttft", ttft))
    out.update(latency_block("tpot", tpot[multi]))
    out.update(latency_block("itl", itl))
    out.update(latency_block("e2e", e2e))
    out.update(latency_block("queue", queue))
    start = float(arrival.min())
    makespan = float(finish.max()) - start if finish.size else 0.0
    good = (ttft <= slo_ttft) & ((tpot <= slo_tpot) | ~multi)
    out["makespan_s"] = makespan
    out["throughput_tokens_per_s"] = float(outputs.sum()) / makespan if makespan > 0 else 0.0
    out["throughput_requests_per_s"] = len(finish) / makespan if makespan > 0 else 0.0
    out["goodput_requests_per_s"] = float(good.sum()) / makespan if makespan > 0 else 0.0
    out["slo_attainment"] = float(good.mean()) if good.size else float("nan")
    return out
