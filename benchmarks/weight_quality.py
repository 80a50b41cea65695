"""What each weight format costs in model quality, against fp32, on the shipped text.

    .venv/bin/python benchmarks/weight_quality.py                  # ppl + greedy + quick suite
    .venv/bin/python benchmarks/weight_quality.py --skip-suite     # minutes, not tens of them

- perplexity: `--windows` windows of `--window` tokens of the bundled Shakespeare text
  (disjoint, spread over the file), each scored in one prefill by the engine's prompt
  log-probabilities; the ratio to fp32's perplexity (goal: within 2 %).
- greedy agreement: 20 prompts (128-token slices of the same text at other offsets), 64
  greedy tokens each, batched as the engine batches them; per format the share of prompts
  whose 64 tokens equal fp32's, the mean length of the common prefix, and the share of
  positions that agree.
- quick suite: the eval's quick suite (`ctxlab eval --suite quick`) per format; the mean
  score with its standard error, and the difference to fp32 in standard errors.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ctxlab.engine import LLM, SamplingParams
from ctxlab.eval.perplexity import text_ids
from ctxlab.eval.vocab import essay_text
from ctxlab.model import load_model
from ctxlab.model.weights import WEIGHT_FORMATS


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def windows(tokenizer, count: int, length: int, skip: int = 0) -> list[list[int]]:
    """`count` token windows from evenly spaced character offsets of the shipped text."""
    chars = len(essay_text())
    step = (chars - length * 8) // (count + skip)
    return [text_ids(tokenizer, length, offset_chars=(i + skip) * step) for i in range(count)]


def perplexity(llm: LLM, texts: list[list[int]]) -> float:
    nll, n = 0.0, 0
    for ids in texts:
        (out,) = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=True))
        scored = [lp for lp in out.prompt_logprobs or [] if lp is not None]
        nll -= sum(scored)
        n += len(scored)
    return math.exp(nll / n)


def greedy(llm: LLM, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params)]


def agreement(ref: list[list[int]], got: list[list[int]]) -> tuple[float, float, float]:
    same = sum(a == b for a, b in zip(ref, got, strict=True)) / len(ref)
    prefixes, positions = [], []
    for a, b in zip(ref, got, strict=True):
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        prefixes.append(k)
        positions.append(sum(x == y for x, y in zip(a, b, strict=True)) / len(a))
    return same, statistics.mean(prefixes), statistics.mean(positions)


def quick_suite(loaded, fmt: str, out: Path) -> tuple[float, float, int]:
    """Mean score, its standard error and the sample count of the eval's quick suite."""
    from ctxlab.eval.engine_backend import EngineBackend, token_counter
    from ctxlab.eval.harness import pool_tokens_for
    from ctxlab.eval.runner import Grid, PolicyRun, depth_grid, run_grid
    from ctxlab.eval.suites import get_suite

    suite = get_suite("quick")
    grid = Grid(
        tasks=list(suite.tasks),
        lengths=list(suite.lengths),
        depths=depth_grid(suite.depths),
        samples=suite.samples,
        runs=[PolicyRun()],
    )
    pool = pool_tokens_for(grid, 4)
    rows = run_grid(
        grid,
        token_counter(loaded.tokenizer),
        lambda run: EngineBackend(loaded, run, kv_pool_tokens=pool),
        out / f"rows-{fmt}.jsonl",
        f"smollm2-135m@{fmt}",
        batch_size=4,
    )
    scores = [float(r["score"]) for r in rows]
    se = statistics.stdev(scores) / math.sqrt(len(scores)) if len(scores) > 1 else math.nan
    return statistics.mean(scores), se, len(scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default=",".join(WEIGHT_FORMATS))
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--skip-suite", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    formats = args.formats.split(",")
    if formats[0] != "fp32":
        formats = ["fp32", *[f for f in formats if f != "fp32"]]
    models = {f: load_model(weights=f) for f in formats}
    tok = models["fp32"].tokenizer
    for m in models.values():
        m._tokenizer = tok  # one tokenizer, built once
    texts = windows(tok, args.windows, args.window)
    prompts = windows(tok, args.prompts, 128, skip=args.windows)
    rows = {}
    ref_ppl, ref_greedy, ref_suite = None, None, None
    out = Path(tempfile.mkdtemp(prefix="weight_quality-"))
    for fmt in formats:
        start = time.perf_counter()
        llm = LLM(models[fmt], kv_pool_tokens=args.window * 2 + 4096, enable_prefix_caching=False)
        ppl = perplexity(llm, texts)
        gen = greedy(llm, prompts, args.tokens)
        ref_ppl = ref_ppl or ppl
        ref_greedy = ref_greedy or gen
        same, prefix, positions = agreement(ref_greedy, gen)
        suite = None if args.skip_suite else quick_suite(models[fmt], fmt, out)
        ref_suite = ref_suite or suite
        rows[fmt] = (ppl, same, prefix, positions, suite, time.perf_counter() - start, load())
        print(f"{fmt}: done in {rows[fmt][5]:.0f} s, load {rows[fmt][6]}", flush=True)
    n_tok = args.windows * (args.window - 1)
    print(f"\nperplexity over {n_tok} tokens ({args.windows} windows of {args.window}); greedy: ")
    print(f"{args.prompts} prompts x {args.tokens} tokens; quick suite rows in {out}")
    print(
        "| format | perplexity | vs fp32 | greedy: all 64 equal | common prefix | positions "
        "equal | quick suite mean ± s.e. | vs fp32 | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for fmt, (ppl, same, prefix, positions, suite, _, ld) in rows.items():
        if suite is None:
            s_txt, d_txt = "-", "-"
        else:
            s_txt = f"{suite[0]:.1f} ± {suite[1]:.1f} (n={suite[2]})"
            diff = suite[0] - ref_suite[0]
            d_txt = f"{diff:+.1f} ({diff / max(suite[1], ref_suite[1], 1e-9):+.1f} s.e.)"
        print(
            f"| {fmt} | {ppl:.3f} | {(ppl / ref_ppl - 1) * 100:+.2f} % | {same * 100:.0f} % | "
            f"{prefix:.1f} | {positions * 100:.1f} % | {s_txt} | {d_txt} | {ld} |"
        )


if __name__ == "__main__":
    main()
