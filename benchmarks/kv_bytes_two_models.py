"""Resident KV bytes per request, measured in the engine, beside the planner's figures.

    .venv/bin/python benchmarks/kv_bytes_two_models.py                 # 1K and 4K tokens
    .venv/bin/python benchmarks/kv_bytes_two_models.py --lengths 1024,4096,8000

For SmolLM2-135M (every layer global) and Gemma 3 270M (15 sliding-window layers of 512
tokens, 3 global): one prompt of N tokens (random ids) and one generated token through the
paged engine (float32 cache, pages of 16 tokens, no prefix cache); the request's resident
bytes are what the scheduler measured from the pool blocks it held at its end. The planner's
figure (`ctxlab plan --gguf FILE --cache-dtype fp32`) is the same file's logical bytes at N
+ 1 tokens. A gap on Gemma is the engine keeping the sliding layers' blocks past the window.
Memory only: no timing, so a busy machine does not change the figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ctxlab.arch.resolve import resolve_arch
from ctxlab.engine import LLM, SamplingParams
from ctxlab.model import load_model
from ctxlab.model.registry import REGISTRY, packaged_path
from ctxlab.plan.memory import request_memory, with_cache_dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--lengths", default="1024,4096")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for name in args.models.split(","):
        path = packaged_path(REGISTRY[name])
        arch = with_cache_dtype(resolve_arch(gguf=path), "fp32")
        loaded = load_model(str(path))
        vocab = loaded.config.vocab_size
        llm = LLM(loaded, kv_pool_tokens=max(lengths) + 256, enable_prefix_caching=False)
        for n in lengths:
            g = torch.Generator().manual_seed(n)
            ids = torch.randint(1000, vocab - 1000, (n,), generator=g).tolist()
            (out,) = llm.generate([ids], SamplingParams(max_tokens=1, ignore_eos=True))
            measured = out.metrics.resident_kv_bytes
            planned = request_memory(arch, n + 1).bytes_per_request
            rows.append((name, n, measured, planned))
            print(f"  {name} {n}: {measured / 2**20:.2f} MiB", file=sys.stderr, flush=True)
    print("\n| model | prompt tokens | measured resident KV | per token | planner (fp32) "
          "| per token | measured / planner |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, n, measured, planned in rows:
        print(
            f"| {name} | {n:,} | {measured / 2**20:.2f} MiB | {measured / (n + 1) / 1024:.1f} KiB "
            f"| {planned / 2**20:.2f} MiB | {planned / (n + 1) / 1024:.1f} KiB "
            f"| {measured / planned:.2f} |"
        )


if __name__ == "__main__":
    main()
