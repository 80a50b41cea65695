"""Read-time selectors at EQUAL keys read per step: Quest, MoBA, DSA, NSA and the full cache.

    .venv/bin/python benchmarks/sparse_reads.py                      # the table in docs/policies.md
    .venv/bin/python benchmarks/sparse_reads.py --n 8 --length 512   # a quick look

Every selector keeps the whole cache (resident KV = `full`'s) and reads at most `--budget`
keys per lane per decode step (`budget` is each policy's keys-read parameter: Quest and
MoBA read budget / page whole pages, DSA reads the sink and current pages plus single
tokens, NSA reads sink, window and selected pages plus one mean-pooled row per other page).
Per policy it prints:
- keys read: the measured share of the keys a dense decode would read (every layer, lane
  and decode step of every request; a compressed row counts as one key);
- accuracy: RULER-style tasks from `ctxlab.eval` (needles in noise and in essays, a
  multi-key needle, variable tracking) at `--length` tokens, needles at spread depths, the
  same `--n` prompts for every policy, greedy; a sample counts when its string-match score
  is 100; Wilson 95 % intervals, and the paired change against `full` (same prompts;
  exact McNemar p). Where the intervals overlap the table says "not established at this n";
- decode step ms: the mean time of the decode steps while every request is still
  decoding (the batch is the same size for every policy), the policies' steps interleaved
  so a busy machine slows them alike;
- selector state: what the selector keeps beside the cache per lane and token (Quest's key
  min and max per page, MoBA's and NSA's key and value sums per page, DSA's indexer keys);
  memory, not reads: it is allocated for the whole pool.

The prompts are prefilled once (a selector changes no prefill): an engine without a policy
prefills every prompt but its last `--tail` tokens into its prefix cache, and each policy's
engine is a copy of it with the policy's runtime installed (its summaries rebuilt from the
cached keys), computing the tail itself.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.eval.engine_backend import prompt_ids, token_counter
from ctxlab.eval.fit import make_sample
from ctxlab.eval.scoring import string_match
from ctxlab.eval.tasks import get_task
from ctxlab.model import load_model
from ctxlab.policy import make_policy
from ctxlab.stats import paired, wilson

TASKS = ("niah_single_noise", "niah_single_essay", "niah_multikey", "vt")
POLICIES = ("full", "quest", "moba", "dsa", "nsa")


def samples(loaded, n: int, length: int, seed: int) -> list:
    """`n` samples cycling over TASKS, depths spread over 5 %-95 %, one seed each."""
    count = token_counter(loaded.tokenizer)
    out = []
    for i in range(n):
        depth = 0.05 + 0.9 * ((i * 7) % n) / max(1, n - 1)
        out.append(make_sample(get_task(TASKS[i % len(TASKS)]), length, depth, seed + i, count))
    return out


def selector_state(name: str, policy, d: int, block: int) -> str:
    """Bytes a selector keeps beside the cache per lane and token (float32 summaries)."""
    if policy is None:
        return "0"
    if name == "quest":
        return f"{2 * d * 4 / block:.0f} B"
    if name in ("moba", "nsa"):
        return f"{(2 * d + 1) * 4 / block:.1f} B"
    if name == "dsa":
        return f"{policy.index_dim * 4} B"
    return "?"


def verdict(acc, ref, p) -> str:
    """Against full: apart when the Wilson intervals do not overlap; else the paired test
    (exact McNemar on the same prompts) at 5 %; else not established at this n."""
    if acc.high < ref.low or acc.low > ref.high:
        return "lower (intervals apart)" if acc.value < ref.value else "higher (intervals apart)"
    if p.mcnemar_p is not None and p.mcnemar_p < 0.05:
        side = "lower" if p.a_better > p.b_better else "higher"
        return f"{side} by the paired test (p = {p.mcnemar_p:.2f}; intervals overlap)"
    return "not established at this n"


def forked(loaded, names, prompts, args) -> dict[str, LLMEngine]:
    from ctxlab.engine.policy_runtime import build_runtime, resolve_policy

    longest = max(len(p) for p in prompts)
    base = LLMEngine(
        loaded.model,
        loaded.config,
        loaded.tokenizer,
        kv_pool_tokens=len(prompts) * (longest + args.max_new + 2 * args.block),
        block_size=args.block,
        enable_prefix_caching=True,
        max_num_batched_tokens=args.chunk,
        max_num_seqs=len(prompts),
    )
    head = SamplingParams(max_tokens=1, ignore_eos=True)
    for p in prompts:
        base.add_request(p[: len(p) - args.tail], head)
    t0 = time.perf_counter()
    while base.has_unfinished():
        base.step()
    print(f"prefilled {len(prompts)} prompts once in {time.perf_counter() - t0:.0f} s", flush=True)
    shared = {id(loaded.model): loaded.model, id(loaded.tokenizer): loaded.tokenizer}
    engines = {}
    for i, name in enumerate(names):
        params = {"window": args.nsa_window} if name == "nsa" else {}
        policy = None if name == "full" else make_policy(name, args.budget, **params)
        eng = base if i == len(names) - 1 else copy.deepcopy(base, dict(shared))
        rope = getattr(loaded.model, "rope", None)
        eng.policy = resolve_policy(policy, None, None)
        eng.runtime = build_runtime(eng.policy, eng.kv, loaded.config.num_heads, rope)
        eng.runner.runtime = eng.runtime
        # attention was handed its page reader when the runner was built: hand it the new one
        eng.runner.backend.pages = eng.runtime.pages  # (built over the filled pool, the
        # page reader has summarised the cached keys: `PageReads` rebuilds them)
        engines[name] = eng
    return engines


def run(engines, prompts, max_tokens) -> tuple[dict, dict, dict]:
    """Generate every prompt under every engine, one step of each in turn; (texts, step
    seconds while the whole batch decodes, keys read fraction) per policy."""
    rids = {}
    for name, eng in engines.items():
        rids[name] = [
            eng.add_request(p, SamplingParams(max_tokens=m, temperature=0.0))
            for p, m in zip(prompts, max_tokens, strict=True)
        ]
    spent = {name: [] for name in engines}
    while any(e.has_unfinished() for e in engines.values()):
        for name, eng in engines.items():
            if not eng.has_unfinished():
                continue
            seqs = [eng.seqs.get(r) for r in rids[name]]
            full_batch = all(s is not None and s.metrics.output_tokens >= 1 and not s.finished
                             for s in seqs)  # fmt: skip
            if full_batch and eng.runtime.pages is not None and not spent[name]:
                pages = eng.runtime.pages  # count decode reads only, from the first decode
                pages.keys_read = pages.keys_total = pages.blocks_read = pages.blocks_total = 0
            t0 = time.perf_counter()
            eng.step()
            if full_batch:
                spent[name].append(time.perf_counter() - t0)
    texts, frac = {}, {}
    for name, eng in engines.items():
        if eng.num_failed_steps:  # a failed step rebuilds the runtime: summaries are lost
            raise RuntimeError(f"{name}: {eng.num_failed_steps} decode step(s) failed")
        texts[name] = [o.text for o in eng.run_all(rids[name])]
        pages = eng.runtime.pages
        frac[name] = 1.0 if pages is None else pages.keys_read_fraction
    return texts, spent, frac


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24, help="prompts (the same for every policy)")
    ap.add_argument("--length", type=int, default=1024, help="tokens per sample")
    ap.add_argument("--budget", type=int, default=256, help="keys read per lane per step")
    ap.add_argument("--nsa-window", type=int, default=32, help="NSA's window (tokens)")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=2048, help="prefill tokens per step")
    ap.add_argument("--tail", type=int, default=32, help="prompt tokens each fork computes")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    loaded = load_model(dtype="float32")
    items = samples(loaded, args.n, args.length, args.seed)
    prompts = [prompt_ids(loaded.tokenizer, s.instruction, s.answer_prefix) for s in items]
    args.max_new = max(s.max_new_tokens for s in items)
    names = args.policies.split(",")
    engines = forked(loaded, names, prompts, args)
    load0 = os.getloadavg()[0]
    texts, spent, frac = run(engines, prompts, [s.max_new_tokens for s in items])
    load1 = os.getloadavg()[0]
    d = loaded.config.head_dim
    ok = {  # a sample counts when its string-match score is 100
        name: [
            string_match(t, s.references, s.metric) == 100.0 for t, s in zip(ts, items, strict=True)
        ]
        for name, ts in texts.items()
    }
    mean_len = sum(len(p) for p in prompts) / len(prompts)
    print(
        f"{args.n} prompts of {args.length} tokens (mean prompt {mean_len:.0f}) over "
        f"{', '.join(TASKS)}; budget {args.budget} keys read per lane per step "
        f"({args.budget / mean_len:.1%} of a mean prompt), block {args.block}, "
        f"NSA window {args.nsa_window}, torch threads {args.threads}"
    )
    print(f"1-min load average {load0:.1f} before decoding, {load1:.1f} after")
    head = f"{'policy':7} {'keys read':>9} {'accuracy (95 % Wilson)':>24} {'vs full (paired)':>18} "
    print(head + f"{'step ms':>8} {'state/token':>11}  resident KV")
    verdicts = []
    for name in names:
        acc = wilson(sum(ok[name]), args.n)
        vs = "-"
        if name != "full" and "full" in ok:
            p = paired([float(x) for x in ok["full"]], [float(x) for x in ok[name]])
            vs = f"+{p.b_better}/-{p.a_better} p={p.mcnemar_p:.2f}"
            verdicts.append(f"{name}: {verdict(acc, wilson(sum(ok['full']), args.n), p)}")
        step = 1000 * sum(spent[name]) / max(1, len(spent[name]))
        state = selector_state(name, engines[name].policy, d, args.block)
        print(
            f"{name:7} {frac[name]:>9.1%} {acc.pct(0):>24} {vs:>18} {step:>8.1f} "
            f"{state:>11}  = full"
        )
    print("accuracy against full: " + "; ".join(verdicts))
    if "quest" in ok:
        vs_quest = []
        for name in names:
            if name in ("full", "quest"):
                continue
            p = paired([float(x) for x in ok["quest"]], [float(x) for x in ok[name]])
            acc, ref = wilson(sum(ok[name]), args.n), wilson(sum(ok["quest"]), args.n)
            vs_quest.append(f"{name} +{p.b_better}/-{p.a_better}: {verdict(acc, ref, p)}")
        print("accuracy against quest (paired, same prompts): " + "; ".join(vs_quest))
    steps = {n: len(s) for n, s in spent.items()}
    print(f"timed decode steps per policy (whole batch decoding): {steps}")
    print(f"whole run {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
