"""float32 vs bfloat16 forward speed of the ctxlab decoder on one 512-token prompt.

bfloat16 halves the bytes read per weight, but it only computes faster on CPUs with bf16
units (AVX512-BF16 or AMX); elsewhere PyTorch converts to float32 inside each kernel. The
script prints the CPU's relevant flags next to the measured ratio so the number carries its
context. Run: `.venv/bin/python benchmarks/model_dtype.py [--tokens 512] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(0)
    results = {}
    for dtype in ("float32", "bfloat16"):
        loaded = load_model(args.model, dtype=dtype)
        ids = torch.randint(0, loaded.config.vocab_size, (args.tokens,), generator=gen)
        results[dtype] = time_forward(loaded.model, ids, args.repeats)
        del loaded
    f32, bf16 = results["float32"], results["bfloat16"]
    flags = " ".join(cpu_flags()) or "none of interest"
    print(f"cpu flags: {flags}; threads: {torch.get_num_threads()}")
    print(f"prompt: {args.tokens} tokens, median of {args.repeats} runs")
    print(f"float32 : {f32:.3f} s  ({args.tokens / f32:,.0f} tokens/s)")
    print(f"bfloat16: {bf16:.3f} s  ({args.tokens / bf16:,.0f} tokens/s)")
    print(f"speed-up bfloat16 over float32: {f32 / bf16:.2f}x")


if __name__ == "__main__":
    main()
