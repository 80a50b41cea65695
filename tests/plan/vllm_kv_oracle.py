"""Run under vLLM's own interpreter (`make vllm`): vLLM's KV cache functions on given layers.

Reads a JSON list of cases (layers as [kind, kv_heads, head_size, window], block size,
max_model_len, tokens in flight, pool bytes, layout name) from argv[1] and prints, per case,
what vLLM's `get_kv_cache_groups`, `get_kv_cache_config_from_groups` and
`get_max_concurrency_for_kv_cache_config` return. Only the config fields those functions
read are given (a namespace, not a full VllmConfig, which would need a model).
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace as NS

import torch
from vllm.v1 import kv_cache_interface as K
from vllm.v1.core import kv_cache_utils as U
from vllm.v1.kv_cache_layout import KVCacheLayout


def config(max_model_len: int, in_flight: int, layout: KVCacheLayout) -> NS:
    return NS(
        scheduler_config=NS(disable_hybrid_kv_cache_manager=False),
        attention_config=NS(hisparse_config=None),
        cache_config=NS(
            get_resolved_kv_cache_layout=lambda: layout,
            num_gpu_blocks_override=None,
            prefix_cache_retention_interval=None,
        ),
        model_config=NS(max_model_len=max_model_len, original_max_model_len=max_model_len),
        parallel_config=NS(decode_context_parallel_size=1, tensor_parallel_size=1),
        max_in_flight_tokens=in_flight,
        num_prefill_lookahead_tokens=0,
        speculative_config=None,
    )


def spec(kind: str, heads: int, head_size: int, window: int | None, block: int) -> K.KVCacheSpec:
    common = {"block_size": block, "head_size": head_size, "dtype": torch.bfloat16}
    if kind == "full":
        return K.FullAttentionSpec(num_kv_heads=heads, **common)
    if kind == "sliding":
        return K.SlidingWindowSpec(num_kv_heads=heads, sliding_window=window, **common)
    return K.MLAAttentionSpec(num_kv_heads=1, **common)


def run(case: dict) -> dict:
    specs = {
        f"layers.{i}": spec(kind, heads, size, window, case["block"])
        for i, (kind, heads, size, window) in enumerate(case["layers"])
    }
    cfg = config(case["max_model_len"], case["in_flight"], KVCacheLayout[case["layout"]])
    groups = U.get_kv_cache_groups(cfg, dict(specs))
    kv_config = U.get_kv_cache_config_from_groups(cfg, groups, case["pool"])
    return {
        "num_blocks": kv_config.num_blocks,
        "max_concurrency": U.get_max_concurrency_for_kv_cache_config(cfg, kv_config),
        "group_sizes": sorted(len(g.layer_names) for g in groups),
    }


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps([run(case) for case in json.load(f)]))
