"""The result block with `vllm bench serve`'s line labels, and the JSON result document.

The labels and layout are vLLM's (`{:<40} {:<10}` lines under a 50-character banner), so a
reader, or a script that parses vLLM's output, finds the same lines. One line is ctxlab's
own: the prompt tokens the server says its prefix cache served (`cached_tokens`), printed
only when the server reports them. After each metric's block come ctxlab's lines for its
sample size and the 95 % bootstrap interval of its median and percentiles (labels vLLM
does not print, so a parser of vLLM's lines is not misled).
"""

from __future__ import annotations

import math
from typing import Any

from ctxlab.bench.metrics import RequestResult, p_word

HEADERS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


def _line(label: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{label:<40} {value:<10.2f}"
    return f"{label:<40} {value:<10}"


def result_lines(
    m: dict[str, Any],
    percentiles: list[float],
    metric_names: list[str],
    max_concurrency: int | None,
    request_rate: float,
) -> list[str]:
    out = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    out.append(_line("Successful requests:", m["completed"]))
    out.append(_line("Failed requests:", m["failed"]))
    if max_concurrency is not None:
        out.append(_line("Maximum request concurrency:", max_concurrency))
    if not math.isinf(request_rate):
        out.append(_line("Request rate configured (RPS):", float(request_rate)))
    out.append(_line("Benchmark duration (s):", float(m["duration"])))
    out.append(_line("Total input tokens:", m["total_input_tokens"]))
    out.append(_line("Total generated tokens:", m["total_output_tokens"]))
    if m.get("cached_input_tokens") is not None:
        out.append(_line("Cached input tokens (server):", m["cached_input_tokens"]))
    out.append(_line("Request throughput (req/s):", m["request_throughput"]))
    if m.get("request_goodput") is not None:
        out.append(_line("Request goodput (req/s):", m["request_goodput"]))
    out.append(_line("Output token throughput (tok/s):", m["output_throughput"]))
    out.append(_line("Peak output token throughput (tok/s):", m["max_output_tokens_per_s"]))
    out.append(_line("Peak concurrent requests:", m["max_concurrent_requests"]))
    out.append(_line("Total Token throughput (tok/s):", m["total_token_throughput"]))
    for name in metric_names:
        short, header = HEADERS[name]
        out.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        out.append(_line(f"Mean {short} (ms):", m[f"mean_{name}_ms"]))
        out.append(_line(f"Median {short} (ms):", m[f"median_{name}_ms"]))
        for p in percentiles:
            out.append(_line(f"P{p_word(p)} {short} (ms):", m[f"p{p_word(p)}_{name}_ms"]))
        out.extend(_interval_lines(m, name, short, percentiles))
    out.append("=" * 50)
    return out


def _interval_lines(
    m: dict[str, Any], name: str, short: str, percentiles: list[float]
) -> list[str]:
    """`TTFT samples (n):` and `Median TTFT 95% CI (ms): 11.50 - 12.40` lines."""
    if "samples" not in m:
        return []
    out = [_line(f"{short} samples (n):", m["samples"][name])]
    labels = [("Median", f"median_{name}_ms")]
    labels += [(f"P{p_word(p)}", f"p{p_word(p)}_{name}_ms") for p in percentiles]
    for label, key in labels:
        iv = m["intervals"].get(key)
        missing = iv is None or iv["low"] is None
        text = "n/a" if missing else f"{iv['low']:.2f} - {iv['high']:.2f}"
        out.append(_line(f"{label} {short} 95% CI (ms):", text))
    return out


def result_document(
    summary: dict[str, Any], results: list[RequestResult], settings: dict[str, Any]
) -> dict[str, Any]:
    """vLLM's result-file keys (settings, figures, per-request lists) plus ctxlab's."""
    ok = [r for r in results if r.success]
    return {
        **settings,
        **summary,
        "input_lens": [r.input_len for r in results],
        "output_lens": [r.output_len if r.success else 0 for r in results],
        "ttfts": [r.ttft if r.success else 0.0 for r in results],
        "itls": [r.itl for r in results],
        "start_times": [r.start for r in results],
        "e2els": [r.latency if r.success else 0.0 for r in results],
        "cached_tokens": [r.cached_tokens for r in results],
        "generated_texts": [r.text for r in results],
        "errors": [r.error for r in results],
        "success_rate": len(ok) / len(results) if results else 0.0,
    }
