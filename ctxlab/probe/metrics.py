"""What a server's Prometheus `/metrics` publishes about its cache.

vLLM (and `ctxlab serve`, whose names are vLLM's) publish `<prefix>:cache_config_info` with
labels `block_size` and `num_gpu_blocks` (capacity = blocks x block size tokens; vLLM 0.32
also `kv_cache_size_tokens`, which differs where a hybrid model's groups share the blocks) and a KV
usage gauge (`kv_cache_usage_perc`, older vLLM `gpu_cache_usage_perc`); SGLang publishes
`sglang:max_total_num_tokens` and `sglang:token_usage`; llama.cpp publishes token counters
but no capacity (its slots and per-slot context come from `/props` instead).
"""

from __future__ import annotations

import math
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
    """Cache capacity in tokens as the server's metrics state it; a published value that
    cannot be a capacity (negative, NaN, inf, not a whole number) is not measured."""
    name_ = "capacity published in /metrics"
    if samples is None:
        return Figure(name_, None, "not measurable", "no /metrics")
    for name, labels, _ in samples:
        if name.endswith(":cache_config_info") and "num_gpu_blocks" in labels:
            try:
                blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
            except (KeyError, ValueError):
                continue
            if blocks < 0 or size < 1:
                return Figure(name_, None, "not measurable", _impossible(name, blocks, size))
            tokens = labels.get("kv_cache_size_tokens", "")
            if tokens.isdigit() and int(tokens) != blocks * size:
                # vLLM's hybrid allocator (sliding and global layers, e.g. Gemma 3) shares
                # the blocks between KV cache groups: its own token figure is the pool
                return Figure(
                    name_, int(tokens), "measured",
                    f"{name}: kv_cache_size_tokens {int(tokens):,} (its num_gpu_blocks {blocks} "
                    f"x block_size {size} are shared by the model's KV cache groups)", "tokens",
                )  # fmt: skip
            return Figure(
                name_, blocks * size, "measured",
                f"{name}: num_gpu_blocks {blocks} x block_size {size}", "tokens",
            )  # fmt: skip
    for name, _labels, value in samples:
        if name == "sglang:max_total_num_tokens":
            if not (math.isfinite(value) and value >= 0 and value.is_integer()):
                return Figure(
                    name_, None, "not measurable", f"{name} is {value:g}, not a token count"
                )
            return Figure(name_, int(value), "measured", name, "tokens")
    return Figure(
        name_, None, "not measurable",
        "the metrics have no cache_config_info or max_total_num_tokens series",
    )  # fmt: skip


def _impossible(name: str, blocks: int, size: int) -> str:
    return (
        f"{name} publishes num_gpu_blocks {blocks} and block_size {size}, which cannot be "
        "a cache's size"
    )


def published_block_size(samples: list[tuple[str, dict[str, str], float]] | None) -> int | None:
    """The block size `cache_config_info` states (vLLM, `ctxlab serve`), or None."""
    for name, labels, _ in samples or []:
        if name.endswith(":cache_config_info"):
            try:
                return int(labels["block_size"])
            except (KeyError, ValueError):
                continue
    return None


def usage_gauge(samples: list[tuple[str, dict[str, str], float]] | None) -> Figure:
    names = ("kv_cache_usage_perc", "gpu_cache_usage_perc", "token_usage", "kv_cache_usage_ratio")
    for name, _labels, value in samples or []:
        if name.split(":")[-1] in names:
            if not (math.isfinite(value) and 0 <= value <= 1):
                return Figure(
                    "KV usage gauge now", None, "not measurable",
                    f"{name} is {value:g}, not a fraction from 0 to 1",
                )  # fmt: skip
            return Figure("KV usage gauge now", value, "measured", name)
    return Figure("KV usage gauge now", None, "not measurable", "no KV usage gauge in /metrics")
