"""Gemma 3 270M: ctxlab against llama.cpp's own Gemma 3 path, same GGUF, same ids, 1 thread.

    .venv/bin/python benchmarks/gemma3_vs_llamacpp.py                  # fp32 and int4
    .venv/bin/python benchmarks/gemma3_vs_llamacpp.py --formats int4 --long 16384

The drivers are `vs_llamacpp.py`'s (llama.cpp's server through the `xllamacpp` wheel in a
worker process; ctxlab's engine in this one), on the file `--model gemma3-270m` assembles
(Q4_K/Q6_K layers, Q8_0 embedding that is also the tied output head). Rows, 1 thread each:
- prefill of one 512- and one 4,096-token prompt (with one sampled token), tok/s;
- batch-1 decode of `--decode` tokens after a 512- and a 4,096-token prompt, tok/s;
- batch-1 decode after a 1,024- and a `--long` (16,384) token prompt: the slow-down from
  1K to 16K context. Only the 3 global layers of 18 grow with the context; the goal is
  at most 1.5x.
Decode is timed over decode steps only (see vs_llamacpp.py). Each row runs `--reps` times,
interleaved across engines; best / median tok/s, ratios of the best in wall and CPU time,
and the 1-minute load average (a shared machine makes every figure noisy: compare ratios
measured side by side, not absolute rates between runs).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from vs_llamacpp import Ctxlab, LlamaCpp, Sample, load, prompts_of, rate

from ctxlab.model import load_model
from ctxlab.model.registry import REGISTRY, packaged_path
from ctxlab.model.weights import step_weight_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="fp32,int4", help="ctxlab weight formats")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--prefill", default="512,4096")
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--long", type=int, default=16384, help="0 skips the 1K/16K rows")
    parser.add_argument("--out", type=Path, default=Path("/tmp/ctxlab-gemma3-vs-llamacpp"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    src = packaged_path(REGISTRY["gemma3-270m"])
    formats = args.formats.split(",")
    prefill_lens = [int(x) for x in args.prefill.split(",")]
    ctx = max([*prefill_lens, args.long]) + args.decode + 64
    torch.set_num_threads(1)
    models = {f: load_model(str(src), weights=f) for f in formats}
    vocab = models[formats[0]].config.vocab_size
    engines = {f"ctxlab {f}": Ctxlab(m, kv_pool_tokens=ctx + 256) for f, m in models.items()}
    engines["llama.cpp"] = LlamaCpp(src, 1, args.out / "llamacpp.log", None, ctx, 1)
    print(f"torch {torch.__version__}, 1 thread each, n_ctx {ctx}, load {load()}")
    for f, m in models.items():
        print(f"ctxlab {f}: {step_weight_bytes(m.model) / 2**20:.0f} MiB of weights per step")
    rows = [(f"prefill {n}", "prefill", n) for n in prefill_lens]
    rows += [(f"decode b=1 after {n}", "decode", n) for n in prefill_lens]
    if args.long:
        rows += [(f"decode b=1 after {n}", "decode", n) for n in (1024, args.long)]
    prompts = {n: prompts_of(vocab, 1, n, 10 + n)[0] for _, _, n in rows}
    for eng in engines.values():  # warm-up: first calls pay page faults and packing
        eng.prefill(prompts[prefill_lens[0]][:64])
    results: dict[tuple[str, str], Sample] = {}
    loads: dict[str, float] = {}
    seen = set()
    for label, kind, n in rows:
        if label in seen:
            continue
        seen.add(label)
        reps = 1 if n > 4096 else args.reps
        for _ in range(reps):
            for name, eng in engines.items():
                start = time.perf_counter()
                if kind == "prefill":
                    wall, cpu = eng.prefill(prompts[n])
                    tokens = n
                else:
                    wall, cpu = eng.decode([prompts[n]], args.decode)
                    tokens = args.decode
                s = results.setdefault((label, name), Sample())
                s.wall.append(wall)
                s.cpu.append(cpu)
                s.tokens = tokens
                took = time.perf_counter() - start
                print(f"  {label} {name}: {tokens / wall:.1f} tok/s ({took:.0f} s)", flush=True)
        loads[label] = load()
    engines["llama.cpp"].close()
    print_table(results, loads, formats, args)


def print_table(results, loads, formats, args) -> None:
    print("\n| figure | ctxlab | tok/s best / median (CPU) | llama.cpp tok/s best / median (CPU) "
          "| ctxlab / llama.cpp wall | CPU | load |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    labels = list(dict.fromkeys(label for label, _ in results))
    for label in labels:
        ob, om, oc = rate(results[(label, "llama.cpp")])
        for f in formats:
            mb, mm, mc = rate(results[(label, f"ctxlab {f}")])
            print(
                f"| {label} | {f} | {mb:.1f} / {mm:.1f} ({mc:.1f}) | {ob:.1f} / {om:.1f} "
                f"({oc:.1f}) | {mb / ob:.2f}x | {mc / oc:.2f}x | {loads[label]:.2f} |"
            )
    if args.long:
        short, long_ = "decode b=1 after 1024", f"decode b=1 after {args.long}"
        print(f"\nslow-down of batch-1 decode from 1,024 to {args.long:,} tokens of context "
              "(best rates in wall and in CPU time; goal <= 1.5x):")  # fmt: skip
        for name in [f"ctxlab {f}" for f in formats] + ["llama.cpp"]:
            a, b = rate(results[(short, name)]), rate(results[(long_, name)])
            print(
                f"  {name}: wall {a[0]:.1f} -> {b[0]:.1f} tok/s, {a[0] / b[0]:.2f}x slower; "
                f"CPU {a[2]:.1f} -> {b[2]:.1f} tok/s, {a[2] / b[2]:.2f}x slower"
            )


if __name__ == "__main__":
    main()
