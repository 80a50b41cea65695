"""int4 prefill against int8's, with int4's prefill copy on and off, side by side (issue 38).

    .venv/bin/python benchmarks/int4_prefill.py --tokens 512,2048 --reps 3

aten's int4 kernel falls further behind fbgemm's int8 as M grows, so an int4 prefill was
2.2-2.6x int8's; `Int4Linear` now runs calls of `qlinear.WIDE_ROWS` tokens or more through an int8
copy of its weights (docs/decode.md). This times one prefill (a `generate` of one token,
prefix cache off) per format and prompt length, interleaved, best of `--reps`, 1 thread, in
CPU time of this process and wall time; "int4, aten kernel" is the same int4 engine with the
copy switched off (`WIDE_ROWS` set above any chunk), i.e. the path before the change.
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
from ctxlab.model import qlinear


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quality", type=int, default=0, help="perplexity over N 1,024-token windows")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    wide_rows = qlinear.WIDE_ROWS
    lengths = [int(t) for t in args.tokens.split(",")]
    pool = max(lengths) + 64
    llms = {
        f: LLM(weights=f, enable_prefix_caching=False, kv_pool_tokens=pool)
        for f in ("int8", "int4")
    }
    subjects = {
        "int8": ("int8", wide_rows),
        "int4, int8 copy (new)": ("int4", wide_rows),
        "int4, aten kernel (before)": ("int4", 1 << 30),
    }
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), capability "
        f"{torch.backends.cpu.get_cpu_capability()}, load {load()}"
    )
    best: dict[tuple[str, int], tuple[float, float]] = {}
    base = 3000
    for _ in range(args.reps):
        for n in lengths:
            for name, (fmt, rows) in subjects.items():
                qlinear.WIDE_ROWS = rows
                base += 7  # a fresh prompt each time: nothing cached
                ids = [list(range(base, base + n))]
                cpu, wall = time.process_time(), time.perf_counter()
                llms[fmt].generate(ids, params)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                old = best.get((name, n), (float("inf"), float("inf")))
                best[(name, n)] = (min(old[0], cpu), min(old[1], wall))
    qlinear.WIDE_ROWS = wide_rows
    print(f"\n| prompt | format | prefill ms, CPU (wall) | tok/s (CPU) | vs int8 | load {load()} |")
    print("|---|---|---|---|---|---|")
    for n in lengths:
        ref = best[("int8", n)][0]
        for name in subjects:
            cpu, wall = best[(name, n)]
            print(
                f"| {n} | {name} | {cpu * 1e3:.0f} ({wall * 1e3:.0f}) | {n / cpu:.0f} | "
                f"{cpu / ref:.2f}x the time | |"
            )
    print(f"\nbest of {args.reps} interleaved runs each")
    if args.quality:
        quality(llms, args.quality, wide_rows)


def quality(llms: dict[str, LLM], count: int, wide_rows: int) -> None:
    """Perplexity of the shipped text (each window one prefill) per path, against fp32."""
    from weight_quality import perplexity, windows

    texts = windows(llms["int8"].loaded.tokenizer, count, 1024)
    fp32 = LLM(weights="fp32", enable_prefix_caching=False, kv_pool_tokens=1200)
    ref = perplexity(fp32, texts)
    print(f"\n| path | perplexity ({count} x 1,024 tokens) | vs fp32 | load {load()} |")
    print("|---|---|---|---|")
    print(f"| fp32 | {ref:.3f} | - | |")
    for name, fmt, rows in (
        ("int8", "int8", wide_rows),
        ("int4, int8 copy (new)", "int4", wide_rows),
        ("int4, aten kernel (before)", "int4", 1 << 30),
    ):
        qlinear.WIDE_ROWS = rows
        ppl = perplexity(llms[fmt], texts)
        print(f"| {name} | {ppl:.3f} | {ppl / ref - 1:+.2%} | |")
    qlinear.WIDE_ROWS = wide_rows


if __name__ == "__main__":
    main()
