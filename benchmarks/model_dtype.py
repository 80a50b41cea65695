"""float32 vs bfloat16 forward speed of the ctxlab decoder on one 512-token prompt.

bfloat16 halves the bytes read per weight, but it only computes faster on CPUs with bf16
units (AVX512-BF16 or AMX); elsewhere PyTorch converts to float32 inside each kernel. The
script prints the CPU's relevant flags next to the measured ratio so the number carries its
context. Run: `.venv/bin/python benchmarks/model_dtype.py [--tokens 512] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

# Before torch loads OpenMP: spinning waits wreck timings on a shared CPU (ctxlab/model/__init__).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from ctxlab.model import DenseBackend, load_model


def cpu_flags() -> list[str]:
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return [f for f in wanted if f in have]


def time_forward(model, ids: torch.Tensor, repeats: int) -> float:
    """Median seconds of a full prefill (fresh cache each time) after one warm-up."""
    times = []
    for i in range(repeats + 1):
        backend = DenseBackend.for_model(model)
        backend.set_batch([0], [0, len(ids)])
        start = time.perf_counter()
        hidden = model.forward(ids, torch.arange(len(ids)), backend)
        model.compute_logits(hidden[-1:])
        if i:  # the first run warms caches and kernels
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_decode(model, ids: torch.Tensor, steps: int) -> float:
    """Median seconds of one single-sequence decode step after the prompt is cached."""
    backend = DenseBackend.for_model(model)
    backend.set_batch([0], [0, len(ids)])
    model.forward(ids, torch.arange(len(ids)), backend)
    token = ids[-1:]
    times = []
    for step in range(steps):
        backend.set_batch([0], [0, 1])
        start = time.perf_counter()
        hidden = model.forward(token, torch.tensor([len(ids) + step]), backend)
        token = model.compute_logits(hidden).argmax(-1)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-steps", type=int, default=16)
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(0)
    prefill, decode = {}, {}
    for dtype in ("float32", "bfloat16"):
        loaded = load_model(args.model, dtype=dtype)
        ids = torch.randint(0, loaded.config.vocab_size, (args.tokens,), generator=gen)
        prefill[dtype] = time_forward(loaded.model, ids, args.repeats)
        decode[dtype] = time_decode(loaded.model, ids, args.decode_steps)
        del loaded
    f32, bf16 = prefill["float32"], prefill["bfloat16"]
    flags = " ".join(cpu_flags()) or "none of interest"
    wait = os.environ.get("OMP_WAIT_POLICY")
    print(f"cpu flags: {flags}; threads: {torch.get_num_threads()}; OMP_WAIT_POLICY={wait}")
    print(f"prompt: {args.tokens} tokens, median of {args.repeats} runs")
    print(f"float32 : {f32:.3f} s  ({args.tokens / f32:,.0f} tokens/s)")
    print(f"bfloat16: {bf16:.3f} s  ({args.tokens / bf16:,.0f} tokens/s)")
    print(f"prefill speed-up bfloat16 over float32: {f32 / bf16:.2f}x")
    d32, d16 = decode["float32"], decode["bfloat16"]
    print(f"decode step after {args.tokens} tokens (median of {args.decode_steps}):")
    print(f"float32 : {d32 * 1000:.1f} ms   bfloat16: {d16 * 1000:.1f} ms")
    print(f"decode speed-up bfloat16 over float32: {d32 / d16:.2f}x")


if __name__ == "__main__":
    main()
