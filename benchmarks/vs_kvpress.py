"""ctxlab's eviction policies side by side with NVIDIA's kvpress (issue 5, "Side by side with
kvpress"): same model, same generated samples, same prompt ids, greedy, same answer budget,
scored by the same ctxlab function; accuracy, KV bytes and peak RSS per press x ratio.

    .venv/bin/python benchmarks/vs_kvpress.py --setup      # build the kvpress venv only
    .venv/bin/python benchmarks/vs_kvpress.py --quick      # small run (a few minutes)
    .venv/bin/python benchmarks/vs_kvpress.py --json out/vs_kvpress.json

kvpress pins its own transformers (<5.3), so it lives in its own virtual environment,
`.bench/kvpress-venv` (git-ignored), built on first run (or with `--setup`) and reused
afterwards. The kvpress side runs in a subprocess with that venv's python
(`benchmarks/_kvpress_worker.py`): it reads the prompt ids as JSON lines and writes the
generated ids, the KV bytes it holds and its peak RSS as JSON lines.

A third side, ctxlab.hf, runs the very same policy objects on transformers' own reading of
the GGUF (this process's transformers, `ctxlab.hf.cache`), so a row also shows what the
policy does outside ctxlab's engine (its streaming keeps original positions there).

Pairs (kvpress press -> ctxlab policy): SnapKVPress -> snapkv, StreamingLLMPress ->
streaming, ObservedAttentionPress (attention accumulated over the prompt's queries) -> h2o
(accumulated attention), KnormPress -> knorm. A compression ratio r keeps 1 - r of the
prompt (ctxlab budget = 1 - r). Both sides compress the whole prompt at prefill (kvpress's
press as a context manager around the prefill forward, then plain greedy decode with the
compressed cache). Each side runs its own defaults, which differ: kvpress's SnapKV
observes 64 queries with an average-pool kernel of 5, ctxlab's 32 with max-pool 7;
ObservedAttention averages every prompt query's attention and never evicts while decoding,
ctxlab's h2o keeps half of the budget as a recent window, seeds its scores with the last 32
prompt queries and keeps evicting while decoding; kvpress's StreamingLLM keeps original
positions, ctxlab's streaming uses cache-slot positions (the paper's); KNorm is the same
rule on both sides.

Memory, as measured, per sample (the table shows the mean):
- KV bytes: kvpress: bytes of the past_key_values tensors when the answer is done (the
  cache after compression plus the answer's tokens); ctxlab: bytes of the pool blocks the
  request holds when it finishes (`resident_kv_bytes`, from the allocator). A method that
  only masks would keep the full size here.
- peak RSS: the process's peak resident set (resource.getrusage ru_maxrss) while that row
  ran, the high-water mark reset before each row (/proc/self/clear_refs). The reset only
  goes down to the current RSS, which holds the float32 weights and whatever heap earlier
  rows left mapped (ctxlab's engine keeps its peak heap on purpose, see engine/malloc.py),
  so at these lengths (KV ~45 MiB against ~1.2 GiB of process) it cannot resolve KV
  differences; it shows the footprint of each runtime, including ctxlab's pool (sized here
  for one request). Not measured: the KV high-water during prefill, where kvpress (which
  compresses each layer as soon as that layer's forward is done) holds one full layer at a
  time and ctxlab holds the whole prompt until its prompt-end cut.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

from _hf_side import load_hf, run_hf
from _kvpress_env import (
    KVPRESS_SPEC,
    PRESSES,
    ROOT,
    TORCH_SPEC,
    VENV,
    peak_rss_bytes,
    reset_peak_rss,
    setup_venv,
)
from _kvpress_side import read_kvpress, run_kvpress  # starts the worker, reads it back

# kvpress press (the worker's name) -> ctxlab policy; a ratio r keeps 1 - r on both sides.
PAIRS = {
    "snapkv": "snapkv",
    "streaming": "streaming",
    "observed_attention": "h2o",
    "knorm": "knorm",
}
BASELINE = ("none", 0.0)  # no press / no policy: the full cache on both sides
MIB = 2**20


def policy_of(row: tuple[str, float]) -> tuple[str, float | None]:
    """A row's ctxlab policy name and budget (a ratio r keeps 1 - r of the prompt)."""
    return ("full", None) if row == BASELINE else (PAIRS[row[0]], round(1.0 - row[1], 6))


# ---------------------------------------------------------------------------- samples


def build_samples(tok, tasks: list[str], length: int, n: int, seed: int) -> list[dict]:
    """ctxlab's generated samples and the prompt ids both sides get (chat + answer prefix)."""
    from ctxlab.eval.engine_backend import prompt_ids, token_counter
    from ctxlab.eval.fit import make_sample
    from ctxlab.eval.tasks import get_task

    count = token_counter(tok)
    out = []
    for task in tasks:
        for k in range(n):
            s = make_sample(get_task(task), length, None, seed + k, count)
            ids = prompt_ids(tok, s.instruction, s.answer_prefix)
            out.append({"index": len(out), "sample": s, "ids": ids})
    return out


# ---------------------------------------------------------------------------- the ctxlab side


def run_ctxlab(loaded, rows, samples: list[dict], block_size: int) -> tuple[dict, dict, dict]:
    """Same rows and prompts through ctxlab's engine, one request at a time (as kvpress)."""
    from ctxlab.engine import LLM, SamplingParams
    from ctxlab.policy import make_policy

    longest = max(len(s["ids"]) + s["sample"].max_new_tokens for s in samples)
    pool = longest + 2 * block_size  # room for one request: what its pool can ever hold
    recs: dict = {}
    peaks: dict = {}
    info = {"block_size": block_size, "kv_pool_tokens": pool}
    for row in rows:
        press, ratio = row
        gc.collect()
        reset_peak_rss()
        policy = None if row == BASELINE else make_policy(PAIRS[press], round(1.0 - ratio, 6))
        llm = LLM(
            loaded,
            kv_pool_tokens=pool,
            block_size=block_size,
            max_num_batched_tokens=longest,  # the whole prompt in one prefill, as kvpress
            policy=policy,
        )
        for smp in samples:
            t = time.perf_counter()
            params = SamplingParams(max_tokens=smp["sample"].max_new_tokens, temperature=0.0)
            out = llm.generate([smp["ids"]], params)[0]
            secs = time.perf_counter() - t
            recs[(row, smp["index"])] = {
                "out_ids": list(out.token_ids),
                "kv_bytes": int(out.metrics.resident_kv_bytes),
                "seconds": round(secs, 2),
            }
            name = policy.name if policy is not None else "full"
            print(f"ctxlab {name} {ratio} sample {smp['index']}: {secs:.2f} s", file=sys.stderr)
        peaks[row] = peak_rss_bytes()
        del llm
    return info, recs, peaks


# ---------------------------------------------------------------------------- report


def summarize(rows, samples, tok, kvp: dict, ctx: dict, hf: dict, peaks: dict):
    from ctxlab.eval.scoring import string_match

    out = []
    for row in rows:
        side: dict = {}
        for name, recs in (("kvpress", kvp), ("ctxlab", ctx), ("ctxlab.hf", hf)):
            scores, kv, preds = [], [], []
            for smp in samples:
                rec = recs[(row, smp["index"])]
                text = tok.decode(rec["out_ids"])
                s = smp["sample"]
                scores.append(string_match(text, s.references, s.metric))
                kv.append(rec["kv_bytes"])
                preds.append(text)
            side[name] = {
                "accuracy": sum(scores) / len(scores),
                "scores": scores,
                "kv_bytes_mean": sum(kv) / len(kv),
                "kv_bytes": kv,
                "predictions": preds,
            }
        for name in side:
            side[name]["peak_rss_bytes"] = peaks[name][row]
        press, ratio = row
        out.append(
            {
                "kvpress_press": "(none)" if row == BASELINE else PRESSES[press],
                "ctxlab_policy": "full" if row == BASELINE else PAIRS[press],
                "compression_ratio": ratio,
                "ctxlab_budget": round(1.0 - ratio, 6),
                **side,
            }
        )
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def print_table(rows_out: list[dict], header: str) -> None:
    cols = [
        ("kvpress press -> ctxlab", 36, "<"),
        ("r", 4, ">"),
        ("acc kvp", 7, ">"),
        ("acc ctx", 7, ">"),
        ("acc hf", 6, ">"),
        ("KV kvp MiB", 10, ">"),
        ("KV ctx MiB", 10, ">"),
        ("KV hf MiB", 9, ">"),
        ("KV ctx/kvp", 10, ">"),
        ("RSS kvp MiB", 11, ">"),
        ("RSS ctx MiB", 11, ">"),
        ("RSS ctx/kvp", 11, ">"),
    ]
    print(header)
    print("  ".join(f"{name:{al}{w}}" for name, w, al in cols))
    print("  ".join("-" * w for _, w, _ in cols))
    for r in rows_out:
        k, c, h = r["kvpress"], r["ctxlab"], r["ctxlab.hf"]
        cells = [
            f"{r['kvpress_press']} -> {r['ctxlab_policy']}",
            f"{r['compression_ratio']:.2f}",
            f"{k['accuracy']:.1f}",
            f"{c['accuracy']:.1f}",
            f"{h['accuracy']:.1f}",
            f"{k['kv_bytes_mean'] / MIB:.2f}",
            f"{c['kv_bytes_mean'] / MIB:.2f}",
            f"{h['kv_bytes_mean'] / MIB:.2f}",
            _ratio(c["kv_bytes_mean"], k["kv_bytes_mean"]),
            f"{k['peak_rss_bytes'] / MIB:.0f}",
            f"{c['peak_rss_bytes'] / MIB:.0f}",
            _ratio(c["peak_rss_bytes"], k["peak_rss_bytes"]),
        ]
        print("  ".join(f"{v:{al}{w}}" for v, (_, w, al) in zip(cells, cols, strict=True)))


# ---------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--setup", action="store_true", help="build the kvpress venv and exit")
    ap.add_argument("--quick", action="store_true", help="small run: 1 sample of 512 tokens")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write every figure here")
    ap.add_argument(
        "--tasks",
        default="niah_single_essay,niah_multikey,qa",
        help="ctxlab eval tasks, comma-separated (default: %(default)s)",
    )
    ap.add_argument("--length", type=int, default=1024, help="tokens per sample (prompt+answer)")
    ap.add_argument("--samples", type=int, default=1, help="samples per task (seeds seed..)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ratios", default="0.25,0.5,0.75", help="compression ratios (evicted share)")
    ap.add_argument("--presses", default=",".join(PAIRS), help="kvpress presses to run")
    ap.add_argument("--no-baseline", action="store_true", help="skip the full-cache row")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per side")
    ap.add_argument(
        "--parallel", action="store_true", help="run both sides at once (2 cores; default: serial)"
    )
    ap.add_argument("--block-size", type=int, default=16, help="ctxlab KV block size")
    ap.add_argument("--venv", type=Path, default=VENV, help="kvpress venv (default %(default)s)")
    ap.add_argument("--torch-spec", default=TORCH_SPEC, help="torch requirement for the venv")
    ap.add_argument("--kvpress-spec", default=KVPRESS_SPEC, help="kvpress requirement")
    args = ap.parse_args()

    setup_venv(args.venv, args.torch_spec, args.kvpress_spec)
    if args.setup:
        return
    if args.quick:
        args.tasks, args.length, args.samples = "niah_single_essay", 512, 1
    presses = [p.strip() for p in args.presses.split(",") if p.strip()]
    unknown = [p for p in presses if p not in PAIRS]
    if unknown:
        sys.exit(f"unknown press {unknown[0]!r}; choose from {', '.join(PAIRS)}.")
    ratios = [float(r) for r in args.ratios.split(",")]
    if any(not 0.0 < r < 1.0 for r in ratios):
        sys.exit("compression ratios must lie strictly between 0 and 1.")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sys.path.insert(0, str(ROOT))
    import torch

    from ctxlab.model import load_model
    from ctxlab.model.registry import resolve_model_path

    torch.set_num_threads(args.threads)
    gguf = resolve_model_path("smollm2-135m")
    t_start = time.perf_counter()
    loaded = load_model(str(gguf))
    ctx_rss_loaded = peak_rss_bytes()
    tok = loaded.tokenizer
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    samples = build_samples(tok, tasks, args.length, args.samples, args.seed)
    rows = [] if args.no_baseline else [BASELINE]
    rows += [(p, r) for p in presses for r in ratios]
    n = len(samples)
    print(
        f"{len(rows)} rows x {n} samples x 3 sides, prompts "
        f"{min(len(s['ids']) for s in samples)}-{max(len(s['ids']) for s in samples)} tokens",
        file=sys.stderr,
    )
    proc = run_kvpress(args.venv, gguf, rows, samples, tok.eos_token_ids, args.threads)
    if not args.parallel:
        proc.wait()
    ctx_info, ctx, ctx_peak = run_ctxlab(loaded, rows, samples, args.block_size)
    hf_model = load_hf(gguf)
    hf_info, hf, hf_peak = run_hf(
        hf_model, rows, policy_of, samples, set(tok.eos_token_ids), args.block_size
    )
    kvp_info, kvp, kvp_peak = read_kvpress(proc)
    elapsed = time.perf_counter() - t_start
    peaks = {"kvpress": kvp_peak, "ctxlab": ctx_peak, "ctxlab.hf": hf_peak}
    rows_out = summarize(rows, samples, tok, kvp, ctx, hf, peaks)

    lens = sorted({len(s["ids"]) for s in samples})
    header = (
        f"SmolLM2-135M-Instruct (GGUF Q4_1, float32), tasks {', '.join(tasks)}, "
        f"{args.samples} sample(s) each at {args.length} tokens (prompts {lens[0]}-{lens[-1]}), "
        f"seed {args.seed}, greedy; kvpress {kvp_info.get('kvpress')} (transformers "
        f"{kvp_info.get('transformers')}), ctxlab block {args.block_size}, ctxlab.hf on "
        f"transformers {hf_info['transformers']} (page {args.block_size}, original positions)\n"
        "acc: ctxlab string-match score 0-100, mean over samples. KV: bytes each side holds "
        "for the request when its answer is done (kvpress: past_key_values tensors; ctxlab: "
        "pool blocks held; ctxlab.hf: its cache tensors), mean per sample. RSS: process peak "
        "resident set during the row "
        "(getrusage, high-water reset per row to the current RSS: weights and retained heap "
        "included)."
    )
    print_table(rows_out, header)
    same = 0
    if not args.no_baseline:
        same = sum(
            kvp[(BASELINE, s["index"])]["out_ids"] == ctx[(BASELINE, s["index"])]["out_ids"]
            for s in samples
        )
        same_hf = sum(
            hf[(BASELINE, s["index"])]["out_ids"] == ctx[(BASELINE, s["index"])]["out_ids"]
            for s in samples
        )
        print(
            f"full cache: identical greedy answers kvpress/ctxlab on {same}/{n} samples, "
            f"ctxlab.hf/ctxlab on {same_hf}/{n}"
        )
    agree = sum(
        hf[(row, s["index"])]["out_ids"] == ctx[(row, s["index"])]["out_ids"]
        for row in rows
        for s in samples
    )
    print(f"ctxlab.hf and the engine gave the same greedy answer in {agree}/{len(rows) * n} cells")
    ctx_info["rss_after_load_bytes"] = ctx_rss_loaded
    secs = {
        name: sum(r["seconds"] for r in recs.values()) for name, recs in (("k", kvp), ("c", ctx))
    }
    print(
        f"peak RSS after loading the model: kvpress worker "
        f"{kvp_info.get('rss_after_load_bytes', 0) / MIB:.0f} MiB, ctxlab "
        f"{ctx_rss_loaded / MIB:.0f} MiB; generation time kvpress {secs['k']:.0f} s, ctxlab "
        f"{secs['c']:.0f} s; wall {elapsed:.0f} s "
        f"({'parallel' if args.parallel else 'serial'}, {args.threads} thread(s) per side)"
    )
    if args.json:
        doc = {
            "model": "smollm2-135m",
            "gguf": str(gguf),
            "tasks": tasks,
            "length": args.length,
            "samples_per_task": args.samples,
            "seed": args.seed,
            "threads": args.threads,
            "parallel": args.parallel,
            "wall_seconds": round(elapsed, 1),
            "kvpress": kvp_info,
            "ctxlab": ctx_info,
            "ctxlab.hf": hf_info,
            "full_cache_identical_answers": same,
            "samples": [
                {
                    "index": s["index"],
                    "task": s["sample"].task,
                    "seed": s["sample"].seed,
                    "prompt_tokens": len(s["ids"]),
                    "references": list(s["sample"].references),
                }
                for s in samples
            ],
            "rows": rows_out,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2))
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
