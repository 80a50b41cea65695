"""`ctxlab bench serve` against `ctxlab serve` and against llama.cpp's own server (the
xllamacpp wheel) on the same GGUF, with the same command line. Prints both of vLLM-style
result blocks, then the ratios ctxlab / llama.cpp, with the load average beside each run.

    .venv/bin/python benchmarks/serve_vs_llamacpp.py                 # 32 prompts, 4 in flight
    .venv/bin/python benchmarks/serve_vs_llamacpp.py --num-prompts 8 # quick

Both servers get the same torch / ggml thread count, run one at a time (never side by side
on the shared cores), and are warmed up by a short run of the same command first (torch's
first forward of each shape, and llama.cpp's graph reuse, are not what serving costs).
ctxlab runs the model in float32 dequantized from the Q4_1 file; llama.cpp runs the Q4_1
weights themselves, so its kernels read about a sixth of the bytes per token.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _serving import bench, ctxlab_server, llamacpp_server, load_average

MODEL = "smollm2-135m"
KEYS = (
    ("request_throughput", "request throughput (req/s)"),
    ("output_throughput", "output throughput (tok/s)"),
    ("median_ttft_ms", "median TTFT (ms)"),
    ("median_tpot_ms", "median TPOT (ms)"),
    ("median_itl_ms", "median ITL (ms)"),
    ("p99_itl_ms", "P99 ITL (ms)"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--max-concurrency", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    common = [
        "--model", MODEL, "--dataset", "random", "--input-len", str(a.input_len),
        "--output-len", str(a.output_len), "--max-concurrency", str(a.max_concurrency),
        "--ignore-eos", "--metric-percentiles", "50,99", "--seed", "0",
    ]  # fmt: skip
    run_args = [*common, "--num-prompts", str(a.num_prompts)]
    warm_args = [*common, "--num-prompts", str(2 * a.max_concurrency), "--seed", "1"]
    slot_ctx = a.input_len + a.output_len + 64
    servers = {
        "ctxlab serve": lambda: ctxlab_server("--threads", str(a.threads)),
        "llama.cpp server (xllamacpp)": lambda: llamacpp_server(
            a.max_concurrency, a.max_concurrency * slot_ctx, a.threads
        ),
    }
    docs = {}
    print("command: ctxlab bench serve --base-url URL " + " ".join(run_args))
    for name, start in servers.items():
        with start() as url:
            bench(url, warm_args)
            before = load_average()
            block, doc = bench(url, run_args)
            after = load_average()
        docs[name] = doc
        print(f"\n### {name} (load average {before} before, {after} after)\n")
        print(block)
    ours, theirs = docs["ctxlab serve"], docs["llama.cpp server (xllamacpp)"]
    print("\n| figure | ctxlab serve | llama.cpp | ctxlab / llama.cpp |")
    print("|---|---:|---:|---:|")
    for key, label in KEYS:
        x, y = ours[key], theirs[key]
        print(f"| {label} | {x:.2f} | {y:.2f} | {x / y:.2f} |")


if __name__ == "__main__":
    main()
