"""KV policies side by side on the default model: decode-step time and resident KV bytes.

    .venv/bin/python benchmarks/policies.py --threads 1     # issue 4 sizes: 8 x 4,000 tokens
    .venv/bin/python benchmarks/policies.py --requests 4 --prompt-tokens 2000   # smaller

One process, one engine per policy, same prompts (different slices of the bundled text, so
the requests share no prefix). The prompts are prefilled once, by an engine whose prefix
cache then serves every policy's engine (a deep copy with the policy's runtime installed;
see `forked`): each policy computes the last `--tail` prompt tokens itself and runs its own
prompt-end cut. `--cold` prefills every engine from scratch instead (slower, same decode).
Then the engines decode `--decode` tokens one step each in turn (interleaved, so a machine
whose load changes slows every policy alike), and only those decode steps are timed.
On a CPU shared with other processes use `--threads 1`: with more threads every parallel
op waits for a descheduled worker thread, and step times grow many times over.
Resident KV bytes are measured from the pool (blocks in use x bytes per block) at the end of
decoding. Quest keeps everything and reports the fraction of KV blocks its decode steps
read. Everything is printed as a ratio against `full`.

Storage formats (`quant`): a name `int8`, `kivi4` or `kivi2` alone is full retention over a
quantized pool; `POLICY+FORMAT` (e.g. `snapkv+kivi4`) runs the policy over one. A quantized
fork's pool is a quantized copy of the base engine's prefix cache (`QuantKVPool.from_pool`:
the same codes a cold run writes, since cached blocks are full); its resident bytes are the
quantized pool's (codes, scales, zero points, full-precision rows of partial KIVI groups).

Eviction policies run with the engine's default schedule: a lane may grow up to one block
less one token past its budget before it is cut back, so lanes are compacted once per block
instead of every step (the resident bound is still budget + one partial block per lane).
SnapKV and PyramidKV re-run their selection every block (`rerun_every = block`), so their
lanes stay bounded during decode too. The 1-minute load average of the machine is printed
before and after the timed decode, since other processes share its cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from importlib import resources
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.kv.quant_pool import QuantKVPool
from ctxlab.kv.quantize import FORMATS
from ctxlab.model import load_model
from ctxlab.policy import make_policy

EVICTING = ("window", "streaming", "h2o", "snapkv", "pyramidkv", "tova")
QUANT = ("int8", "kivi4", "snapkv+int8", "snapkv+kivi4")


def build(name: str, budget: int, block: int):
    """(policy, KV storage format) for a benchmark name: `snapkv`, `kivi4`, `snapkv+kivi4`."""
    base, _, fmt = name.partition("+")
    if base in FORMATS:
        return make_policy("quant", fmt=base), base
    fmt = fmt or None
    if base == "full":
        return None, fmt
    if base == "quest":
        return make_policy("quest", budget), fmt
    extra = {"rerun_every": block} if base in ("snapkv", "pyramidkv") else {}
    return make_policy(base, budget, **extra), fmt


def bench_engine(loaded, prompts: list[list[int]], args, prefix_caching: bool, **kw) -> LLMEngine:
    """An engine whose pool holds every request whole (prompt, decode, one spare block)."""
    return LLMEngine(
        loaded.model,
        loaded.config,
        loaded.tokenizer,
        kv_pool_tokens=len(prompts) * (args.prompt_tokens + args.decode + args.block),
        block_size=args.block,
        enable_prefix_caching=prefix_caching,
        max_num_batched_tokens=args.chunk,
        max_num_seqs=len(prompts),
        **kw,
    )


def prefilled(loaded, name: str, prompts: list[list[int]], args) -> LLMEngine:
    """An engine for one policy with every request prefilled (first token sampled)."""
    policy, fmt = build(name, args.budget, args.block)
    eng = bench_engine(loaded, prompts, args, False, policy=policy, kv_format=fmt)
    params = SamplingParams(max_tokens=args.decode + 1, ignore_eos=True)
    eng.bench_rids = [eng.add_request(p, params) for p in prompts]  # type: ignore[attr-defined]
    while any(eng.seqs[r].metrics.output_tokens == 0 for r in eng.bench_rids):  # type: ignore[attr-defined]
        eng.step()
    if eng.runtime.pages is not None:
        eng.runtime.pages.blocks_total = eng.runtime.pages.blocks_read = 0
    return eng


def forked(loaded, names: list[str], prompts: list[list[int]], args) -> dict[str, LLMEngine]:
    """One engine per policy, all forked from one engine that prefilled the prompts once.

    The base engine (no policy, prefix caching on) runs every prompt but its last
    `args.tail` tokens, so their full blocks stay in its prefix cache. Each policy gets a
    deep copy of that engine (the model weights are shared, not copied) with the policy's
    runtime installed, and then the real requests: the prefix cache supplies all but the
    tail, and the policy's engine computes the tail itself, recording its queries and
    running its prompt-end cut as in any run with a prefix hit. What is skipped is only
    the per-chunk cuts of positional policies inside the cached part, which change no
    decode cost. Prefill is then paid once instead of once per policy.
    """
    from ctxlab.engine.policy_runtime import build_runtime, resolve_policy

    base = bench_engine(loaded, prompts, args, True)
    head = SamplingParams(max_tokens=1, ignore_eos=True)
    for p in prompts:
        base.add_request(p[: len(p) - args.tail], head)
    t0 = time.perf_counter()
    while base.has_unfinished():
        base.step()
    print(f"prefilled the shared prefix in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    params = SamplingParams(max_tokens=args.decode + 1, ignore_eos=True)
    shared = {id(loaded.model): loaded.model, id(loaded.tokenizer): loaded.tokenizer}
    engines = {}
    for i, name in enumerate(names):
        policy, fmt = build(name, args.budget, args.block)
        memo = dict(shared)
        pool = None
        if fmt is not None:  # the fork gets a quantized copy of the pool, not a float one
            pool = QuantKVPool.from_pool(base.kv.pool, fmt)
            memo[id(base.kv.pool)] = pool
        # The last policy takes the base engine itself: one pool fewer in memory.
        eng = base if i == len(names) - 1 else copy.deepcopy(base, memo)
        if pool is not None:
            eng.kv.pool = eng.runner.backend.pool = pool
            eng.kv.kv_format = fmt
        rope = getattr(loaded.model, "rope", None)
        eng.policy = resolve_policy(policy, None, fmt)
        eng.runtime = build_runtime(eng.policy, eng.kv, loaded.config.num_heads, rope)
        eng.runner.runtime = eng.runtime
        eng.runner.backend.pages = eng.runtime.pages  # the fork's reader, not the base's
        if eng.runtime.pages is not None:
            eng.runtime.pages.rebuild()  # Quest: summaries of the cached keys
        eng.bench_rids = [eng.add_request(p, params) for p in prompts]  # type: ignore[attr-defined]
        while any(eng.seqs[r].metrics.output_tokens == 0 for r in eng.bench_rids):  # type: ignore[attr-defined]
            eng.step()
        hits = eng.kv.stats().prefix_cache_hits
        print(f"forked {name} (prefix-cache hit tokens {hits:,})", file=sys.stderr, flush=True)
        if eng.runtime.pages is not None:
            eng.runtime.pages.blocks_total = eng.runtime.pages.blocks_read = 0
        engines[name] = eng
    return engines


def decode_interleaved(engines: dict[str, LLMEngine]) -> list[dict]:
    """Decode every engine one step at a time, in turn, so a busy machine slows all alike."""
    spent = dict.fromkeys(engines, 0.0)
    steps = dict.fromkeys(engines, 0)
    resident = dict.fromkeys(engines, 0)
    while any(e.has_unfinished() for e in engines.values()):
        for name, eng in engines.items():
            if not eng.has_unfinished():
                continue
            t0 = time.perf_counter()
            eng.step()
            spent[name] += time.perf_counter() - t0
            steps[name] += 1
            if not any(eng.seqs[r].finished for r in eng.bench_rids):  # type: ignore[attr-defined]
                resident[name] = eng.kv.resident_bytes()  # the last step frees everything
    rows = []
    for name, eng in engines.items():
        pages = eng.runtime.pages
        rows.append(
            {
                "policy": name,
                "decode_step_s": spent[name] / steps[name],
                "resident_kv_bytes": resident[name],
                "kv_read_fraction": None if pages is None else pages.read_fraction,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--policies", default=",".join(("full", *EVICTING, "quest", *QUANT)))
    ap.add_argument(
        "--cold",
        action="store_true",
        help="prefill every policy's engine from scratch instead of forking one prefilled engine",
    )
    ap.add_argument("--tail", type=int, default=64, help="prompt tokens each fork computes")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--weights", default="fp32", help="fp32, bf16, int8 or int4 linear layers")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(weights=args.weights)
    tok = loaded.tokenizer
    text = resources.files("ctxlab").joinpath("data/tinyshakespeare.txt").read_text()
    ids = tok.encode(text[: args.requests * args.prompt_tokens * 6])
    need = args.requests * args.prompt_tokens
    if len(ids) < need:
        raise SystemExit(f"the bundled text has {len(ids)} tokens, {need} are needed")
    prompts = [
        ids[i * args.prompt_tokens : (i + 1) * args.prompt_tokens] for i in range(args.requests)
    ]
    names = args.policies.split(",")
    if args.cold:
        engines = {}
        for name in names:
            t0 = time.perf_counter()
            engines[name] = prefilled(loaded, name, prompts, args)
            print(f"prefilled {name} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    else:
        engines = forked(loaded, names, prompts, args)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    rows = decode_interleaved(engines)
    decode_s = time.perf_counter() - t0
    load_after = os.getloadavg()[0]
    full = next(r for r in rows if r["policy"] == "full")
    for r in rows:
        r["step_speedup_vs_full"] = full["decode_step_s"] / r["decode_step_s"]
        r["resident_vs_full"] = r["resident_kv_bytes"] / full["resident_kv_bytes"]
    if args.json:
        load = {"before": load_before, "after": load_after}
        print(json.dumps({"args": vars(args), "load_1min": load, "rows": rows}, indent=2))
        return
    print(
        f"{args.requests} requests x {args.prompt_tokens} prompt tokens, {args.decode} decode "
        f"tokens together, budget {args.budget}, block {args.block}, weights {args.weights}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(
        f"timed decode {decode_s:.0f} s (all policies interleaved); 1-min load average "
        f"{load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} CPUs"
    )
    print(
        f"{'policy':<13} {'step ms':>9} {'speedup':>8} {'resident KV':>14} {'vs full':>8} "
        f"{'KV read/step':>12}"
    )
    for r in rows:
        read = "" if r["kv_read_fraction"] is None else f"{r['kv_read_fraction']:.1%}"
        print(
            f"{r['policy']:<13} {r['decode_step_s'] * 1e3:>9.1f} "
            f"{r['step_speedup_vs_full']:>7.2f}x {r['resident_kv_bytes']:>14,} "
            f"{r['resident_vs_full']:>8.1%} {read:>12}"
        )


if __name__ == "__main__":
    main()
