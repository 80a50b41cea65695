"""The planner's vLLM prediction against vLLM itself: the session's live server
(`vllm_server`: SmolLM2-135M in float32, `VLLM_CPU_KVCACHE_SPACE=1`, `--max-model-len 2048`,
`--num-gpu-blocks-override 48`), and vLLM's own KV cache functions run in its environment.

vLLM logs what it would have allocated before the override ("Overriding num_gpu_blocks=N
with num_gpu_blocks_override=48") and, after it, its capacity line ("CPU KV cache size: T
tokens, Maximum concurrency for L tokens per request: Cx"); `get_kv_cache_configs` plans the
override as `override x bytes per block` of memory, which is how the planner is asked here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from ctxlab.arch import get_preset
from ctxlab.arch.spec import ArchSpec, LayerSpec, interleaved_layers
from ctxlab.plan.engines import predict_engine_pool
from ctxlab.plan.memory import with_cache_dtype
from tests.vllm_server import (
    VLLM,
    VLLM_BLOCKS,
    VLLM_DTYPE,
    VLLM_MAX_LEN,
    VLLM_MODEL,
    VllmServer,
    vllm_env,
    vllm_python,
)

pytestmark = [pytest.mark.vllm, pytest.mark.server, pytest.mark.xdist_group(VLLM)]

GIB = 2**30
OVERRIDE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")
CAPACITY = re.compile(
    r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
    r"([\d.]+)x"
)


def _log_match(server: VllmServer, pattern: re.Pattern[str]) -> re.Match[str]:
    end = time.monotonic() + 30  # the engine core's lines reach the shared log shortly
    while True:
        found = pattern.search(server.log.read_text(errors="replace"))
        if found or time.monotonic() > end:
            assert found, f"vLLM's log ({server.log}) has no line matching {pattern.pattern}"
            return found
        time.sleep(0.5)


def test_the_prediction_is_what_the_live_vllm_reports(vllm_server: VllmServer):
    if vllm_server.log == Path(os.devnull):
        pytest.skip("a server started by hand (CTXLAB_VLLM_URL): its start-up log is not here")
    spec = with_cache_dtype(get_preset(VLLM_MODEL), VLLM_DTYPE)  # vLLM's cache: the model's dtype
    full = predict_engine_pool(
        spec, "vllm", platform="cpu", kv_cache_bytes=GIB, max_model_len=VLLM_MAX_LEN
    )
    before, override = (int(g) for g in _log_match(vllm_server, OVERRIDE).groups())
    assert override == VLLM_BLOCKS
    assert full.num_blocks == before  # what 1 GiB gives, as vLLM computed it
    assert full.bytes_per_block is not None
    pool = predict_engine_pool(
        spec, "vllm", platform="cpu", kv_cache_bytes=VLLM_BLOCKS * full.bytes_per_block,
        max_model_len=VLLM_MAX_LEN,
    )  # fmt: skip
    tokens, length, concurrency = _log_match(vllm_server, CAPACITY).groups()
    assert int(length.replace(",", "")) == VLLM_MAX_LEN
    assert pool.num_blocks == VLLM_BLOCKS
    assert f"{pool.max_concurrency:.2f}" == concurrency
    assert pool.kv_cache_tokens == int(tokens.replace(",", ""))


ORACLE = Path(__file__).with_name("vllm_kv_oracle.py")


def _layers(spec: ArchSpec) -> list[list[object]]:
    return [
        ["mla", 1, layer.d_c + layer.d_rope, None]
        if layer.kind == "mla"
        else [layer.kind, layer.kv_heads, layer.d_k, layer.window]
        for layer in spec.layers
    ]


@pytest.mark.slow
def test_the_prediction_is_what_vllms_own_functions_return(tmp_path):
    """vLLM's kv_cache_utils, run in its own environment on the same layers, pools and
    lengths: CPU and GPU defaults, hybrid patterns with unequal counts, MLA, all-sliding."""
    python = vllm_python()
    if python is None:
        pytest.skip(f"vLLM's CPU build is not installed in {vllm_env()}: run `make vllm`")
    slide = LayerSpec("sliding", kv_heads=1, d_k=256, d_v=256, window=512)
    full = LayerSpec("full", kv_heads=1, d_k=256, d_v=256)
    gemma_1b_like = ArchSpec("26 layers, 1 in 6 global", interleaved_layers(26, slide, full, 6),
                             4, 1152, 10**9)  # fmt: skip
    twelve_thirteen = ArchSpec("12 sliding + 13 full", (slide,) * 12 + (full,) * 13, 4, 1152, 1)
    runs = [
        (get_preset(name), pool, length, "cpu", None, "LBHNC")
        for name, lengths in (("smollm2-135m", (4096, 2048)), ("gemma-3-270m", (32768, 2048)))
        for pool in (GIB // 4, GIB, 4 * GIB)
        for length in lengths
    ] + [
        (get_preset("gemma-3-270m"), GIB, 32768, "cpu", None, "BLHNC"),
        (get_preset("gemma-3-27b"), 19 * GIB, 32768, "gpu", None, "LBHNC"),
        (get_preset("gemma-3-27b"), 19 * GIB, 131072, "gpu", 2048, "LBHNC"),
        (get_preset("gpt-oss-20b"), 20 * GIB, 131072, "gpu", None, "LBHNC"),
        (get_preset("deepseek-v3"), 40 * GIB, 32768, "gpu", None, "LBHNC"),
        (get_preset("mistral-7b-v0.1"), GIB, 32768, "cpu", None, "LBHNC"),
        (gemma_1b_like, GIB, 32768, "cpu", None, "LBHNC"),
        (twelve_thirteen, GIB, 8192, "cpu", None, "LBHNC"),
    ]
    cases, predicted = [], []
    for spec, pool, length, platform, batched, layout in runs:
        p = predict_engine_pool(
            spec, "vllm", platform=platform, kv_cache_bytes=pool, max_model_len=length,
            max_num_batched_tokens=batched, device_memory_bytes=80 * GIB,
        )  # fmt: skip
        assert p.settings.max_num_batched_tokens is not None
        in_flight = (1 if platform == "cpu" else 2) * p.settings.max_num_batched_tokens
        cases.append({
            "layers": _layers(spec), "block": p.block_size, "max_model_len": length,
            "in_flight": in_flight, "pool": pool, "layout": layout,
        })  # fmt: skip
        predicted.append(p)
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    proc = subprocess.run(
        [str(python), str(ORACLE), str(path)], capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "VLLM_NO_USAGE_STATS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout)
    for (spec, pool, length, *_), p, got in zip(runs, predicted, answers, strict=True):
        where = f"{spec.name}, {pool:,} bytes, {length:,} tokens"
        assert p.num_blocks == got["num_blocks"], where
        assert p.max_concurrency == pytest.approx(got["max_concurrency"], rel=1e-12), where
        assert sorted(len(g.layers) for g in p.groups) == got["group_sizes"], where
