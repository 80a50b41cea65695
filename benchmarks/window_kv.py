"""Windowed layers on the real engine: resident KV per request against the planner, and
prefix reuse of a repeated long prompt.

    .venv/bin/python benchmarks/window_kv.py                       # 4K, 8K, 16K, 32K + 8K reuse
    .venv/bin/python benchmarks/window_kv.py --lengths 4096 --prefix 0

Model: gemma3-270m (15 sliding-window layers of W = 512, 3 global; one KV head of 256), the
engine's cache dtype float32, pages of 16 tokens. Prompt: the bundled Shakespeare text,
tokenized with the model's tokenizer.

1. Per length n: one request of an n-token prompt and max_tokens 1 (the sampled token is never
   written), prefilled in chunks of `--chunk`. Measured: the request's resident KV bytes when it
   finishes (`RequestMetrics.resident_kv_bytes`: blocks held x bytes per block), the pool's
   peak blocks in use over the run (the chunk being written included), and the prefill time.
   Beside them: the planner's figures for the same GGUF header at fp32 (`ctxlab plan --gguf
   FILE --cache-dtype fp32`): the logical bytes (sliding layers hold W tokens) and the
   page-rounded bytes (`ctxlab.plan.paging.paged_request`: full layers ceil(n/P) pages, a
   sliding layer the pages covering [n - W, n)); and what the same model would hold with every
   layer global.
2. Prefix reuse: the same `--prefix`-token prompt twice on one engine; reused tokens (from the
   prefix cache), recomputed tokens, time of each run, whether the greedy tokens agree.
3. `--equal-pool` (alone): `--requests` prompts of `--input` tokens on the windowed model and
   on the all-global `--global-model` (smollm2-135m), each engine's pool the same bytes
   (`--pool-tokens` of the all-global model; the workshop's demonstration 7 engine pool and
   long workload by default): requests running at once, bytes per request, TTFT p50/p99.

Times are wall-clock on whatever else the machine runs (the 1-minute load is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from importlib import resources
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ctxlab.arch.gguf_meta import from_gguf
from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.kv.seq_kv import SeqKV
from ctxlab.model import load_model
from ctxlab.plan.memory import with_cache_dtype
from ctxlab.plan.paging import paged_request

MiB = 1 << 20


def engine(loaded, pool_tokens: int, chunk: int, block: int) -> LLMEngine:
    # The engine takes prompts of at most max_position - 1 tokens (room for a generated
    # token's position); a prompt of the trained 32,768 tokens with max_tokens 1 computes
    # positions 0..32,767 only, so the limit is raised by one token for it.
    trained = int(getattr(loaded.config, "max_position", 0) or 0)
    return LLMEngine(
        loaded.model,
        loaded.config,
        loaded.tokenizer,
        kv_pool_tokens=pool_tokens,
        block_size=block,
        max_num_batched_tokens=chunk,
        max_num_seqs=4,
        model_id="gemma3-270m",
        max_model_len=max(trained, pool_tokens) + 1 if trained else None,
    )


def run_one(eng: LLMEngine, ids: list[int], max_tokens: int = 1) -> tuple[object, int, float]:
    """The request's output, the peak blocks in use during it, and its wall time.

    The peak is read each step just before the sliding lanes hand blocks back (the chunk
    just written still held), by wrapping `KVCacheManager.slide` for the run."""
    peak = 0
    slide = eng.kv.slide

    def counted(seq: SeqKV) -> int:
        nonlocal peak
        peak = max(peak, eng.kv.alloc.num_used)
        return slide(seq)

    eng.kv.slide = counted  # type: ignore[method-assign]
    t0 = time.perf_counter()
    rid = eng.add_request(ids, SamplingParams(max_tokens=max_tokens))
    while eng.has_unfinished():
        eng.step()
    secs = time.perf_counter() - t0
    eng.kv.slide = slide  # type: ignore[method-assign]
    out = eng.output(rid)
    del eng.seqs[rid]
    return out, peak, secs


def resident_rows(loaded, arch, all_ids: list[int], lengths: list[int], args) -> list[dict]:
    cfg = loaded.config
    per_slot = 2 * cfg.head_dim * cfg.num_kv_heads * 4  # one layer's K and V, float32
    rows = []
    for n in lengths:
        eng = engine(loaded, n + 2 * args.block, args.chunk, args.block)
        out, peak, secs = run_one(eng, all_ids[:n])
        paged = paged_request(arch, n, args.block)
        row = {
            "tokens": n,
            "measured_bytes": out.metrics.resident_kv_bytes,
            "planner_paged_bytes": paged.allocated_bytes,
            "planner_logical_bytes": arch.request_bytes(n),
            "all_global_bytes": cfg.num_layers * per_slot * -(-n // args.block) * args.block,
            "peak_pool_bytes": peak * eng.kv.pool.block_bytes,
            "planner_peak_bytes": paged.peak_allocated_bytes,
            "prefill_s": round(secs, 1),
            "load_1min": os.getloadavg()[0],
        }
        row["equal"] = row["measured_bytes"] == row["planner_paged_bytes"]
        rows.append(row)
        print(
            f"{n:>6,} tokens: measured {row['measured_bytes'] / MiB:.2f} MiB, planner "
            f"{row['planner_paged_bytes'] / MiB:.2f} MiB paged / "
            f"{row['planner_logical_bytes'] / MiB:.2f} MiB logical, all-global "
            f"{row['all_global_bytes'] / MiB:.2f} MiB, peak in pool "
            f"{row['peak_pool_bytes'] / MiB:.2f} MiB, prefill {secs:.0f} s",
            file=sys.stderr,
        )
        del eng
    return rows


def prefix_rows(loaded, all_ids: list[int], n: int, args) -> dict:
    eng = engine(loaded, 2 * n + 4 * args.block, args.chunk, args.block)
    ids = all_ids[:n]
    cold, _, cold_s = run_one(eng, ids, args.decode)
    warm, _, warm_s = run_one(eng, ids, args.decode)
    st = eng.stats()
    row = {
        "prompt_tokens": n,
        "reused_tokens": warm.metrics.reused_tokens,
        "recomputed_tokens": n - warm.metrics.reused_tokens,
        "cold_s": round(cold_s, 2),
        "warm_s": round(warm_s, 2),
        "same_tokens": cold.token_ids == warm.token_ids,
        "blocks_slid": st.blocks_slid,
        "cached_blocks_detached": st.cached_blocks_detached,
        "cached_blocks_evicted": st.cached_blocks_evicted,
        "load_1min": os.getloadavg()[0],
    }
    print(f"prefix reuse: {json.dumps(row)}", file=sys.stderr)
    return row


def equal_pool_rows(args) -> list[dict]:
    """The same workload on the windowed model and an all-global one, each engine given a
    pool of the same bytes (the all-global model's `--pool-tokens`): requests running at
    once, bytes each held at its end, TTFT. A window only pays past W tokens, so the
    prompts are longer than it."""
    from ctxlab.workshop.measure import median, pct

    text = resources.files("ctxlab").joinpath("data/tinyshakespeare.txt").read_text()
    rows, pool_bytes = [], 0
    for role, name in (("all-global", args.global_model), ("windowed", args.model)):
        loaded = load_model(name)
        cfg = loaded.config
        per_token = cfg.num_layers * cfg.num_kv_heads * 2 * cfg.head_dim * 4  # float32 K, V
        if not pool_bytes:
            pool_bytes = args.pool_tokens * per_token
        tokens = pool_bytes // per_token // args.block * args.block
        eng = LLMEngine(
            loaded.model,
            cfg,
            loaded.tokenizer,
            kv_pool_tokens=tokens,
            block_size=args.block,
            max_num_batched_tokens=args.chunk,
            max_num_seqs=args.requests,
            model_id=name,
        )
        ids = list(loaded.tokenizer.encode(text[: 8 * args.input * (args.requests + 1)]))
        params = SamplingParams(max_tokens=args.output, ignore_eos=True)
        prompts = [ids[i * args.input : (i + 1) * args.input] for i in range(args.requests)]
        rids = [eng.add_request(p, params) for p in prompts]
        peak = 0
        while eng.has_unfinished():
            eng.step()
            peak = max(peak, eng.num_running)
        ms = [eng.output(r).metrics for r in rids]
        row = {
            "role": role,
            "model": name,
            "pool_bytes": eng.stats().pool_bytes,
            "pool_tokens_per_lane": tokens,
            "requests": args.requests,
            "tokens_per_request": args.input + args.output,
            "concurrency_reached": peak,
            "bytes_per_request": int(median([m.resident_kv_bytes for m in ms])),
            "ttft_p50_ms": round(pct([m.ttft * 1e3 for m in ms], 50), 1),
            "ttft_p99_ms": round(pct([m.ttft * 1e3 for m in ms], 99), 1),
            "preemptions": sum(m.preemptions for m in ms),
            "load_1min": os.getloadavg()[0],
        }
        print(f"equal pool: {json.dumps(row)}", file=sys.stderr)
        rows.append(row)
        del eng, loaded
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m", help="a model with sliding layers")
    ap.add_argument("--lengths", default="4096,8192,16384,32768", help="prompt lengths")
    ap.add_argument("--prefix", type=int, default=8192, help="repeated prompt (0: skip)")
    ap.add_argument("--decode", type=int, default=8, help="tokens each prefix run decodes")
    ap.add_argument("--chunk", type=int, default=2048, help="prefill chunk (tokens per step)")
    ap.add_argument("--block", type=int, default=16, help="page size in tokens")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--equal-pool", action="store_true", help="only the equal-pool comparison")
    ap.add_argument("--global-model", default="smollm2-135m", help="the all-global model")
    ap.add_argument("--pool-tokens", type=int, default=2560, help="all-global model's pool")
    ap.add_argument("--requests", type=int, default=4, help="equal-pool requests")
    ap.add_argument("--input", type=int, default=1024, help="equal-pool prompt tokens")
    ap.add_argument("--output", type=int, default=8, help="equal-pool output tokens")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.equal_pool:
        rows = equal_pool_rows(args)
        print(json.dumps(rows, indent=2))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2) + "\n")
        return
    loaded = load_model(args.model)
    arch = with_cache_dtype(from_gguf(loaded.source_path), "fp32")
    lengths = [int(x) for x in args.lengths.split(",") if x]
    text = resources.files("ctxlab").joinpath("data/tinyshakespeare.txt").read_text()
    need = max([*lengths, args.prefix])
    all_ids = list(loaded.tokenizer.encode(text[: need * 6]))
    if len(all_ids) < need:
        all_ids = (all_ids * (need // len(all_ids) + 1))[:need]
    result = {
        "model": args.model,
        "windows": sorted({w for w in loaded.config.sliding_windows if w}),
        "block": args.block,
        "chunk": args.chunk,
        "resident": resident_rows(loaded, arch, all_ids, lengths, args),
    }
    if args.prefix:
        result["prefix"] = prefix_rows(loaded, all_ids, args.prefix, args)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
