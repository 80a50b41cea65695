"""`ctxlab bench serve` against `ctxlab serve` (fp32, fp32-onednn, bf16, int8, int4) and against
vLLM's CPU build (fp32, bf16) on the same model, with the same command lines, in one run.
Two workloads (issue 38's): random 128 in / 32 out, and one shared 512-token prefix before 64
new tokens / 32 out. Prints each vLLM-style result block with the load average around it,
then one table per workload with every server's figures and its ratio to vLLM bf16.

    make vllm && ctxlab export-hf smollm2-135m
    .venv/bin/python benchmarks/serve_vs_vllm.py                  # 24 prompts, 4 in flight
    .venv/bin/python benchmarks/serve_vs_vllm.py --num-prompts 8 --workloads random  # quick
    .venv/bin/python benchmarks/serve_vs_vllm.py --servers "vLLM fp32,ctxlab serve int8"

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
# issue 38's two workloads: random prompts, and one shared 512-token prefix before 64 new tokens
WORKLOADS = {
    "random": ["--dataset", "random"],
    "shared-prefix": ["--dataset", "shared-prefix", "--prefix-len", "512", "--num-prefixes", "1"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--input-len", type=int, default=128, help="random: prompt tokens")
    ap.add_argument("--suffix-len", type=int, default=64, help="shared-prefix: tokens after it")
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--max-concurrency", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workloads", default="random,shared-prefix", help=", ".join(WORKLOADS))
    ap.add_argument("--servers", default="", help="comma-separated names (default: all)")
    ap.add_argument("--eager", action="store_true", help="vLLM --enforce-eager")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ctxlab.hf.export import export_folder

    folder = str(export_folder(MODEL))
    common = [
        "--model", MODEL, "--output-len", str(a.output_len),
        "--max-concurrency", str(a.max_concurrency), "--ignore-eos",
        "--metric-percentiles", "50,99", "--seed", "0",
    ]  # fmt: skip
    lengths = {"random": str(a.input_len), "shared-prefix": str(a.suffix_len)}
    workloads = [w for w in a.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workload {unknown[0]!r}: choose from {', '.join(WORKLOADS)}")
    t = str(a.threads)
    servers = {
        **{
            f"ctxlab serve {w}": (lambda w=w: ctxlab_server("--threads", t, "--weights", w))
            for w in ("fp32", "fp32-onednn", "bf16", "int8", "int4")
        },
        "vLLM fp32": lambda: vllm_server(folder, MODEL, "float32", a.threads, a.eager),
        "vLLM bf16": lambda: vllm_server(folder, MODEL, "bfloat16", a.threads, a.eager),
    }
    if a.servers:
        servers = {k: v for k, v in servers.items() if k in a.servers.split(",")}
    docs: dict[tuple[str, str], tuple[dict, str]] = {}
    commands = {w: [*common, *WORKLOADS[w], "--input-len", lengths[w]] for w in workloads}
    for w, args in commands.items():
        print(f"command ({w}): ctxlab bench serve --base-url URL {' '.join(args)} "
              f"--num-prompts {a.num_prompts}")  # fmt: skip
    for name, start in servers.items():
        with start() as url:
            for w, args in commands.items():
                # the warm-up has its own seed, so on shared-prefix its prefix is another
                # one: the run's first requests compute theirs, the later ones reuse it
                bench(url, [*args, "--num-prompts", str(2 * a.max_concurrency), "--seed", "1"])
                before = load_average()
                block, doc = bench(url, [*args, "--num-prompts", str(a.num_prompts)])
                after = load_average()
                docs[name, w] = (doc, f"{before} / {after}")
                print(f"\n### {name}, {w} (load average {before} before, {after} after)\n")
                print(block, flush=True)
    for w in workloads:
        ref = docs.get(("vLLM bf16", w), (None, ""))[0]
        print(f"\n{w}:\n")
        print("| server | " + " | ".join(lbl for _, lbl in KEYS) + " | tok/s / vLLM bf16 | load |")
        print("|---|" + "---:|" * (len(KEYS) + 1) + "---|")
        for name in servers:
            doc, load = docs[name, w]
            cells = " | ".join(f"{doc[k]:.1f}" for k, _ in KEYS)
            ratio = f"{doc['output_throughput'] / ref['output_throughput']:.2f}" if ref else "-"
            print(f"| {name} | {cells} | {ratio} | {load} |")


if __name__ == "__main__":
    main()
