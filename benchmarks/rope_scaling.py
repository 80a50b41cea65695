"""Past the trained length: no scaling, position interpolation, NTK and YaRN, untuned.

    .venv/bin/python benchmarks/rope_scaling.py                          # the table in docs/eval.md
    .venv/bin/python benchmarks/rope_scaling.py --tokens 4096 --needles 2  # a quick look
    .venv/bin/python benchmarks/rope_scaling.py --tokens 0 --needles 4      # needles only

SmolLM2-135M was trained to 8,192 positions and its checkpoint asks for no RoPE scaling.
Each method is applied as `--rope-scaling` applies it (`ctxlab.model.rope_override`: the
checkpoint as it is, no fine-tuning) and measured two ways:
- perplexity per `--segment`-token segment of one `--tokens`-token passage of the shipped
  Shakespeare, every token scored against the whole prefix (the engine's prompt
  log-probabilities, chunked prefill); the interval is a percentile bootstrap over blocks of
  `--block` consecutive tokens inside the segment (blocks, not tokens, because neighbouring
  tokens' losses are correlated), exp of the mean NLL and of its bounds;
- a needle (`niah_single_essay`: a number hidden in that prose, asked for at the end) at
  `--needle-length` tokens, `--needles` prompts with depths spread over 10-90 %, the same
  prompts for every method, greedy; a sample counts when its string-match score is 100;
  Wilson 95 % intervals.
Dynamic NTK recomputes its base from the longest position of each forward call, so under
chunked prefill keys cached before position 8,192 keep the original base (as transformers
does with a cache).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ctxlab.engine import LLM, SamplingParams
from ctxlab.eval.engine_backend import prompt_ids, token_counter
from ctxlab.eval.fit import make_sample
from ctxlab.eval.perplexity import text_ids
from ctxlab.eval.scoring import string_match
from ctxlab.eval.tasks import get_task
from ctxlab.model import load_model
from ctxlab.model.rope_override import trained_length
from ctxlab.stats import bootstrap, wilson

METHODS = ("none", "linear:2", "dynamic:2", "yarn:2")


def _blocks(nll: list[float], block: int) -> list[float]:
    return [sum(nll[i : i + block]) / len(nll[i : i + block]) for i in range(0, len(nll), block)]


def paired_rows(nll: list[float], ref: list[float], segment: int, block: int) -> list[dict]:
    """Per segment: perplexity ratio against `ref` on the same tokens, with a paired
    bootstrap over blocks (exp of the mean per-block NLL difference and of its bounds)."""
    rows = []
    for start in range(0, len(nll), segment):
        a = _blocks(nll[start : start + segment], block)
        b = _blocks(ref[start : start + segment], block)
        iv = bootstrap([x - y for x, y in zip(a, b, strict=True)], lambda xs: sum(xs) / len(xs))
        ratio = {"ratio": math.exp(iv.value), "low": math.exp(iv.low), "high": math.exp(iv.high)}
        rows.append({"end": start + len(nll[start : start + segment]), **ratio, "blocks": iv.n})
    return rows


def segment_rows(nll: list[float], segment: int, block: int) -> list[dict]:
    """Per segment: its end, perplexity and the block-bootstrap interval."""
    rows = []
    for start in range(0, len(nll), segment):
        part = nll[start : start + segment]
        blocks = [
            sum(part[i : i + block]) / len(part[i : i + block]) for i in range(0, len(part), block)
        ]
        weights = [len(part[i : i + block]) for i in range(0, len(part), block)]
        # equal-size blocks (the last may be shorter): the weighted mean is the segment's mean
        iv = bootstrap(
            list(zip(blocks, weights, strict=True)),
            lambda xs: sum(b * w for b, w in xs) / sum(w for _, w in xs),  # type: ignore[misc]
        )
        rows.append(
            {
                "end": start + len(part),
                "ppl": math.exp(iv.value),
                "low": math.exp(iv.low),
                "high": math.exp(iv.high),
                "blocks": iv.n,
            }
        )
    return rows


def perplexity(loaded, ids: list[int], args) -> list[float]:
    llm = LLM(
        loaded,
        kv_pool_tokens=len(ids) + 64,
        enable_prefix_caching=False,
        max_num_batched_tokens=args.chunk,
        max_model_len=len(ids) + 2,
    )
    (out,) = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=True))
    return [lp for lp in out.prompt_logprobs or [] if lp is not None]


def needles(loaded, samples, args) -> list[bool]:
    prompts = [prompt_ids(loaded.tokenizer, s.instruction, s.answer_prefix) for s in samples]
    longest = max(len(p) for p in prompts) + max(s.max_new_tokens for s in samples)
    llm = LLM(
        loaded,
        kv_pool_tokens=longest + 64,
        enable_prefix_caching=False,
        max_num_batched_tokens=args.chunk,
        max_num_seqs=1,
        max_model_len=longest + 2,
    )
    hits = []
    for s, p in zip(samples, prompts, strict=True):
        (out,) = llm.generate([p], SamplingParams(max_tokens=s.max_new_tokens, temperature=0.0))
        hits.append(string_match(out.text, s.references, s.metric) == 100)
    return hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--tokens", type=int, default=12288)
    ap.add_argument("--segment", type=int, default=1024)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--needles", type=int, default=4)
    ap.add_argument("--needle-length", type=int, default=11264)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    print(f"load average at start: {os.getloadavg()}", flush=True)
    t_start, cpu_start = time.perf_counter(), time.process_time()

    results: dict[str, dict] = {m: {} for m in methods}
    trained = None

    def save() -> None:
        if args.json:
            doc = {"args": {k: str(v) for k, v in vars(args).items()}, "trained": trained,
                   "results": results, "wall_s": time.perf_counter() - t_start,
                   "cpu_s": time.process_time() - cpu_start}  # fmt: skip
            args.json.write_text(json.dumps(doc, indent=2))

    # Phase 1, perplexity for every method; phase 2, the needles (so a cut run keeps a whole
    # perplexity table).
    for method in methods if args.tokens else []:
        t0 = time.perf_counter()
        loaded = load_model(args.model, rope_scaling=method)
        trained = trained_length(loaded.config)
        ids = text_ids(loaded.tokenizer, args.tokens)
        results[method]["nll"] = [-x for x in perplexity(loaded, ids, args)]
        save()
        print(f"{method} perplexity: {time.perf_counter() - t0:.0f} s; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    samples = None
    for method in methods if args.needles else []:
        t0 = time.perf_counter()
        loaded = load_model(args.model, rope_scaling=method)
        if samples is None:
            count = token_counter(loaded.tokenizer)
            task = get_task("niah_single_essay")
            depths = [0.1 + 0.8 * i / max(1, args.needles - 1) for i in range(args.needles)]
            samples = [
                make_sample(task, args.needle_length, d, args.seed + i, count)
                for i, d in enumerate(depths)
            ]
        hits = needles(loaded, samples, args)
        results[method]["needle_hits"] = hits
        save()
        took = time.perf_counter() - t0
        print(f"{method} needle: {wilson(sum(hits), len(hits)).pct()}, {took:.0f} s; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip

    base = methods[0]
    for m in methods if args.tokens else []:
        results[m]["segments"] = segment_rows(results[m]["nll"], args.segment, args.block)
        if m != base:
            results[m]["vs_" + base] = paired_rows(
                results[m]["nll"], results[base]["nll"], args.segment, args.block
            )
    save()
    ends = [r["end"] for r in results[base]["segments"]] if args.tokens else []
    if ends:
        print(f"\nperplexity per {args.segment}-token segment (trained length {trained:,}); "
              f"[95 % block bootstrap, blocks of {args.block} tokens]")  # fmt: skip
        print("| tokens | " + " | ".join(methods) + " |")
        print("|---|" + "---|" * len(methods))
        for i, (start, end) in enumerate(zip([0, *ends], ends, strict=False)):
            cells = []
            for m in methods:
                r = results[m]["segments"][i]
                cell = f"{r['ppl']:.1f} [{r['low']:.1f}, {r['high']:.1f}]"
                if m != base:
                    q = results[m]["vs_" + base][i]
                    cell += f" (x{q['ratio']:.2f} [{q['low']:.2f}, {q['high']:.2f}])"
                cells.append(cell)
            mark = " (past trained)" if end > (trained or 0) else ""
            print(f"| {start + 1:,}-{end:,}{mark} | " + " | ".join(cells) + " |")
    if samples:
        sizes = [s.prompt_tokens for s in samples]
        depths = ", ".join(f"{s.depth:.0%}" for s in samples)
        print(f"\nneedle at {args.needle_length:,} tokens ({len(samples)} prompts, depths "
              f"{depths}; prompt tokens {min(sizes):,}-{max(sizes):,})")  # fmt: skip
        for m in methods:
            hits = results[m].get("needle_hits", [])
            marks = "".join("x" if h else "." for h in hits)
            print(f"| {m} | {wilson(sum(hits), len(hits)).pct()} | {marks} |")
    wall, cpu = time.perf_counter() - t_start, time.process_time() - cpu_start
    print(f"\nwall {wall:.0f} s, this process's CPU {cpu:.0f} s; load average at end: "
          f"{os.getloadavg()}")  # fmt: skip
    save()


if __name__ == "__main__":
    main()
