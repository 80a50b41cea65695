"""`ctxlab bench serve` against `ctxlab serve` (fp32, fp32-onednn, bf16, int8, int4; bf16 and int8
also with a bfloat16 KV cache, `--kv-cache-dtype bfloat16`) and against
vLLM's CPU build (fp32, bf16) on the same model, with the same command lines, in one run.
Two workloads (issue 38's): random 128 in / 32 out, and one shared 512-token prefix before 64
new tokens / 32 out. Prints each vLLM-style result block with the load average around it,
then one table per workload with every server's figures and its ratio to vLLM at the same
precision (fp32 weights against vLLM fp32, the others against vLLM bf16).

    make vllm && ctxlab export-hf smollm2-135m
    .venv/bin/python benchmarks/serve_vs_vllm.py                  # 24 prompts, 4 in flight
    .venv/bin/python benchmarks/serve_vs_vllm.py --num-prompts 8 --workloads random  # quick
    .venv/bin/python benchmarks/serve_vs_vllm.py --servers "vLLM fp32,ctxlab serve int8"
    .venv/bin/python benchmarks/serve_vs_vllm.py --servers "ctxlab serve bf16,vLLM bf16" --repeat 3

`--repeat N` runs every server N times, alternating the order (forwards, then backwards, ...),
so a drift of the machine's speed over the run falls on both sides; the table then gives each
figure's median over the rounds with its range, and each ratio from servers of the same round.

Every server gets one thread, runs alone (never side by side on the shared cores) and is
warmed up by a short run of the same command first. vLLM runs compiled (its default: eager
prefilled about 13x slower here, docs/deployment.md; `--eager` for a quick run that starts
faster) from the Hugging Face folder `ctxlab export-hf` writes (float32 weights dequantized from the
Q4_1 GGUF, cast to `--dtype`); ctxlab serve reads the GGUF itself.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Callable
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
    ap.add_argument("--repeat", type=int, default=1, help="rounds, the order alternating")
    a = ap.parse_args()
    if a.repeat < 1:
        raise SystemExit(f"--repeat {a.repeat}: give 1 or more rounds.")
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
    servers: dict[str, Callable[[], contextlib.AbstractContextManager[str]]] = {
        **{
            f"ctxlab serve {w}": (lambda w=w: ctxlab_server("--threads", t, "--weights", w))
            for w in ("fp32", "fp32-onednn", "bf16", "int8", "int4")
        },
        # the same formats without ctxlab's compiled loops (ctxlab/native.py): torch's kernels
        **{
            f"ctxlab serve {w} (torch kernels)": (
                lambda w=w: ctxlab_server(
                    "--threads", t, "--weights", w, env_extra={"CTXLAB_NATIVE": "off"}
                )
            )
            for w in ("fp32", "bf16")
        },
        # K/V stored in bfloat16 as vLLM bf16 stores them (the activations stay float32)
        **{
            f"ctxlab serve {w} (bf16 KV)": (
                lambda w=w: ctxlab_server(
                    "--threads", t, "--weights", w, "--kv-cache-dtype", "bfloat16"
                )
            )
            for w in ("bf16", "int8")
        },
        "vLLM fp32": lambda: vllm_server(folder, MODEL, "float32", a.threads, a.eager),
        "vLLM bf16": lambda: vllm_server(folder, MODEL, "bfloat16", a.threads, a.eager),
    }
    if a.servers:
        chosen = [n.strip() for n in a.servers.split(",") if n.strip()]
        unknown = [n for n in chosen if n not in servers]
        if unknown:
            raise SystemExit(f"unknown server {unknown[0]!r}: choose from {', '.join(servers)}")
        servers = {k: v for k, v in servers.items() if k in chosen}
    # (server, workload) -> one (result document, load) per round
    docs: dict[tuple[str, str], list[tuple[dict, str]]] = {}
    commands = {w: [*common, *WORKLOADS[w], "--input-len", lengths[w]] for w in workloads}
    for w, args in commands.items():
        print(f"command ({w}): ctxlab bench serve --base-url URL {' '.join(args)} "
              f"--num-prompts {a.num_prompts}")  # fmt: skip
    for r in range(a.repeat):
        order = list(servers) if r % 2 == 0 else list(servers)[::-1]
        for name in order:
            with servers[name]() as url:
                for w, args in commands.items():
                    # the warm-up has its own seed, so on shared-prefix its prefix is another
                    # one: the run's first requests compute theirs, the later ones reuse it
                    warm = [*args, "--num-prompts", str(2 * a.max_concurrency), "--seed", "1"]
                    bench(url, warm)
                    before = load_average()
                    block, doc = bench(url, [*args, "--num-prompts", str(a.num_prompts)])
                    after = load_average()
                    docs.setdefault((name, w), []).append((doc, f"{before} / {after}"))
                    print(f"\n### round {r + 1}: {name}, {w} "
                          f"(load average {before} before, {after} after)\n")  # fmt: skip
                    print(block, flush=True)
    for w in workloads:
        print_table(w, list(servers), {n: docs[n, w] for n in servers})


def reference(name: str, present: list[str]) -> str | None:
    """The vLLM server a ctxlab server is compared with: the same precision where it ran."""
    if name.startswith("vLLM"):
        return name
    same = "vLLM fp32" if name.startswith("ctxlab serve fp32") else "vLLM bf16"
    return same if same in present else ("vLLM bf16" if "vLLM bf16" in present else None)


def spread(values: list[float], digits: int = 1) -> str:
    """One value as it is; several as their median and range."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    mid, lo, hi = statistics.median(values), min(values), max(values)
    return f"{mid:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def print_table(workload: str, names: list[str], rounds: dict[str, list[tuple[dict, str]]]) -> None:
    """One workload's table: each figure per server (median and range over the rounds), and
    the ratio of output tok/s to its reference vLLM, round by round."""
    print(f"\n{workload}:\n")
    print("| server | " + " | ".join(lbl for _, lbl in KEYS) + " | tok/s / vLLM | load |")
    print("|---|" + "---:|" * (len(KEYS) + 1) + "---|")
    for name in names:
        got = rounds[name]
        cells = " | ".join(spread([doc[k] for doc, _ in got]) for k, _ in KEYS)
        ref = reference(name, names)
        ratio = "-"
        if ref == name:
            ratio = "1.00"
        elif ref is not None:
            pairs = zip(got, rounds[ref], strict=True)
            per_round = [
                d["output_throughput"] / r["output_throughput"] for (d, _), (r, _) in pairs
            ]
            ratio = f"{spread(per_round, 2)} ({ref})"
        loads = ", ".join(load for _, load in got)
        print(f"| {name} | {cells} | {ratio} | {loads} |")


if __name__ == "__main__":
    main()
