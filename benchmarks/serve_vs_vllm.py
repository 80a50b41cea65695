"""`ctxlab bench serve` against `ctxlab serve` (fp32, bf16, int8, int4 weights) and against
vLLM's CPU build (fp32, bf16) on the same model, with the same command line, in one run.
Prints each vLLM-style result block with the load average around it, then one table with
every server's figures and its ratio to vLLM bf16 (the engine users deploy).

    make vllm && ctxlab export-hf smollm2-135m
    .venv/bin/python benchmarks/serve_vs_vllm.py                  # 24 prompts, 4 in flight
    .venv/bin/python benchmarks/serve_vs_vllm.py --num-prompts 8  # quick

Every server gets one thread, runs alone (never side by side on the shared cores) and is
warmed up by a short run of the same command first. vLLM runs compiled (its default: eager
prefilled about 13x slower here, docs/deployment.md; `--eager` for a quick run that starts
faster) from the Hugging Face folder `ctxlab export-hf` writes (float32 weights dequantized from the
Q4_1 GGUF, cast to `--dtype`); ctxlab serve reads the GGUF itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _serving import bench, ctxlab_server, load_average, vllm_server

MODEL = "smollm2-135m"
KEYS = (
    ("output_throughput", "output tok/s"),
    ("median_ttft_ms", "TTFT p50 (ms)"),
    ("median_tpot_ms", "TPOT p50 (ms)"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--max-concurrency", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eager", action="store_true", help="vLLM --enforce-eager")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ctxlab.hf.export import export_folder

    folder = str(export_folder(MODEL))
    common = [
        "--model", MODEL, "--dataset", "random", "--input-len", str(a.input_len),
        "--output-len", str(a.output_len), "--max-concurrency", str(a.max_concurrency),
        "--ignore-eos", "--metric-percentiles", "50,99", "--seed", "0",
    ]  # fmt: skip
    run_args = [*common, "--num-prompts", str(a.num_prompts)]
    warm_args = [*common, "--num-prompts", str(2 * a.max_concurrency), "--seed", "1"]
    t = str(a.threads)
    servers = {
        **{
            f"ctxlab serve {w}": (lambda w=w: ctxlab_server("--threads", t, "--weights", w))
            for w in ("fp32", "bf16", "int8", "int4")
        },
        "vLLM fp32": lambda: vllm_server(folder, MODEL, "float32", a.threads, a.eager),
        "vLLM bf16": lambda: vllm_server(folder, MODEL, "bfloat16", a.threads, a.eager),
    }
    docs = {}
    print("command: ctxlab bench serve --base-url URL " + " ".join(run_args))
    for name, start in servers.items():
        with start() as url:
            bench(url, warm_args)
            before = load_average()
            block, doc = bench(url, run_args)
            after = load_average()
        docs[name] = (doc, f"{before} / {after}")
        print(f"\n### {name} (load average {before} before, {after} after)\n")
        print(block)
    ref = docs["vLLM bf16"][0]
    print("\n| server | " + " | ".join(lbl for _, lbl in KEYS) + " | tok/s / vLLM bf16 | load |")
    print("|---|" + "---:|" * (len(KEYS) + 2))
    for name, (doc, load) in docs.items():
        cells = " | ".join(f"{doc[k]:.1f}" for k, _ in KEYS)
        ratio = doc["output_throughput"] / ref["output_throughput"]
        print(f"| {name} | {cells} | {ratio:.2f} | {load} |")


if __name__ == "__main__":
    main()
