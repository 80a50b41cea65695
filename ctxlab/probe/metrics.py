"""What a server's Prometheus `/metrics` publishes about its cache.

vLLM (and `ctxlab serve`, whose names are vLLM's) publish `<prefix>:cache_config_info` with
labels `block_size` and `num_gpu_blocks` (capacity = blocks x block size tokens) and a KV
usage gauge (`kv_cache_usage_perc`, older vLLM `gpu_cache_usage_perc`); SGLang publishes
`sglang:max_total_num_tokens` and `sglang:token_usage`; llama.cpp publishes token counters
but no capacity (its slots and per-slot context come from `/props` instead).
"""

from __future__ import annotations

import re

from ctxlab.probe.client import ProbeClient
from ctxlab.probe.figures import Figure

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(textdoc: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in textdoc.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        try:
            out.append((m.group(1), labels, float(m.group(3))))
        except ValueError:
            continue
    return out


def scrape(client: ProbeClient) -> list[tuple[str, dict[str, str], float]] | None:
    r = client.get("/metrics")
    if r is None or r.status_code != 200:
        return None
    return parse(r.text)


def published_capacity(samples: list[tuple[str, dict[str, str], float]] | None) -> Figure:
    """Cache capacity in tokens as the server's metrics state it."""
    if samples is None:
        return Figure("capacity published in /metrics", None, "not measurable", "no /metrics")
    for name, labels, _ in samples:
        if name.endswith(":cache_config_info") and "num_gpu_blocks" in labels:
            try:
                blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
            except (KeyError, ValueError):
                continue
            return Figure(
                "capacity published in /metrics", blocks * size, "measured",
                f"{name}: num_gpu_blocks {blocks} x block_size {size}", "tokens",
            )  # fmt: skip
    for name, _labels, value in samples:
        if name == "sglang:max_total_num_tokens":
            return Figure("capacity published in /metrics", int(value), "measured", name, "tokens")
    return Figure(
        "capacity published in /metrics", None, "not measurable",
        "the metrics have no cache_config_info or max_total_num_tokens series",
    )  # fmt: skip


def usage_gauge(samples: list[tuple[str, dict[str, str], float]] | None) -> Figure:
    names = ("kv_cache_usage_perc", "gpu_cache_usage_perc", "token_usage", "kv_cache_usage_ratio")
    for name, _labels, value in samples or []:
        if name.split(":")[-1] in names:
            return Figure("KV usage gauge now", value, "measured", name)
    return Figure("KV usage gauge now", None, "not measurable", "no KV usage gauge in /metrics")
