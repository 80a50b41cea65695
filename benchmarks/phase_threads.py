"""Threads per phase: decode-only steps on 1 thread (the default) against all threads.

    .venv/bin/python benchmarks/phase_threads.py                 # int8, torch at 2 threads
    .venv/bin/python benchmarks/phase_threads.py --formats int8,int4 --threads 2 --reps 3

One process, torch set to `--threads`; for each format, batch-1 decode (64 steps after a
512-token prompt), batch-16 decode (32 steps after 256-token prompts) and one 512-token
prefill, with `CTXLAB_DECODE_THREADS` = 1 (the engine's default: decode-only steps on one
thread, `ctxlab/engine/phase_threads.py`) and = 0 (every step on all threads, torch's
choice), interleaved; best of `--reps`, wall tok/s, and the ratio default / all threads.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ctxlab.engine import LLM, SamplingParams
from ctxlab.engine.phase_threads import ENV


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def decode_rate(llm: LLM, prompts: list[list[int]], steps: int) -> float:
    eng = llm.engine
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    rids = [eng.add_request(p, params) for p in prompts]
    while any(eng.seqs[r].metrics.output_tokens == 0 for r in rids):
        eng.step()
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    dt = time.perf_counter() - t
    eng.run_all(rids)
    return steps * len(prompts) / dt


def prefill_rate(llm: LLM, prompt: list[int]) -> float:
    t = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    return len(prompt) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="int8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    one = [torch.randint(1000, 40000, (512,), generator=g).tolist()]
    sixteen = torch.randint(1000, 40000, (16, 256), generator=g).tolist()
    print(f"torch {torch.__version__}, torch threads {args.threads}, load {load()}")
    print("| format | figure | default (decode on 1 thread) tok/s | all threads tok/s | ratio |")
    print("|---|---|---|---|---|")
    for f in args.formats.split(","):
        llm = LLM(weights=f, kv_pool_tokens=16 * 400 + 1024, enable_prefix_caching=False)
        figures = {
            "decode b=1": lambda llm=llm: decode_rate(llm, one, 64),
            "decode b=16": lambda llm=llm: decode_rate(llm, sixteen, 32),
            "prefill 512": lambda llm=llm: prefill_rate(llm, one[0]),
        }
        for label, fn in figures.items():
            best = {"1": 0.0, "0": 0.0}
            for _ in range(args.reps):
                for mode in best:
                    os.environ[ENV] = mode
                    best[mode] = max(best[mode], fn())
            print(
                f"| {f} | {label} | {best['1']:.1f} | {best['0']:.1f} | "
                f"{best['1'] / best['0']:.2f}x | load {load()}"
            )
    os.environ.pop(ENV, None)


if __name__ == "__main__":
    main()
