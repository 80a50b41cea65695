"""Full-cache decode per token with lanes read in place vs gathered, at 512, 4K and 16K context.

    .venv/bin/python benchmarks/decode_in_place.py --threads 1
    .venv/bin/python benchmarks/decode_in_place.py --contexts 512,4096 --decode 16

Before this change every layer of every decode step gathered each lane's whole KV into a
contiguous tensor (`KVPool.gather`: a copy of the whole cache per token). Now a lane whose
blocks lie in long runs of adjacent blocks (lane-major allocation makes a prompt chunk one
run per lane) is read in place (`KVPool.run_view`, a view), and only the short remainder
(decode-time blocks, the partial last one) is gathered. Both paths live in the engine
(`Runner.in_place`; the in-place column is forced at every length, whatever the
engine's threshold `IN_PLACE_MIN_TOKENS` picks by default), so this script measures them
side by side in one process:
one engine per context length (the default model, no policy, bundled text as the prompt),
prefilled once, then decode steps alternating gathered / in place on the same sequence, so
a changing machine load slows both alike. It prints per-token step time of each, the ratio,
the bytes the gather copies per token, and the 1-minute load average. Greedy agreement:
a copy of each prefilled engine decodes `--check` tokens gathered, the original in place,
and the tokens are compared.
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

import ctxlab.engine.lane_runs as lane_runs
from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.model import load_model

DEFAULT_MIN = lane_runs.IN_PLACE_MIN_TOKENS


def prefilled(loaded, ids: list[int], decode: int, block: int, chunk: int) -> LLMEngine:
    eng = LLMEngine(
        loaded.model,
        loaded.config,
        loaded.tokenizer,
        kv_pool_tokens=len(ids) + decode + 2 * block,
        block_size=block,
        max_num_batched_tokens=chunk,
        enable_prefix_caching=False,
        # SmolLM2 is trained to 8,192 positions; 16K runs past it (speed, not quality).
        max_model_len=max(len(ids) + decode + 1, loaded.config.max_position),
    )
    eng.bench_rid = eng.add_request(ids, SamplingParams(max_tokens=decode + 1, ignore_eos=True))  # type: ignore[attr-defined]
    while eng.seqs[eng.bench_rid].metrics.output_tokens == 0:  # type: ignore[attr-defined]
        eng.step()
    return eng


def decode_tokens(eng: LLMEngine, n: int) -> list[int]:
    """The next `n` greedy tokens of the engine's one sequence."""
    seq = eng.seqs[eng.bench_rid]  # type: ignore[attr-defined]
    for _ in range(n):
        eng.step()
    return seq.output_ids[-n:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="512,4096,16384", help="prompt tokens, comma-separated")
    ap.add_argument("--decode", type=int, default=24, help="timed decode steps per context")
    ap.add_argument("--check", type=int, default=12, help="tokens compared for greedy agreement")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=4096, help="prefill chunk (engine default)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lane_runs.IN_PLACE_MIN_TOKENS = 0  # measure in place at every length
    loaded = load_model()
    text = resources.files("ctxlab").joinpath("data/tinyshakespeare.txt").read_text()
    contexts = [int(c) for c in args.contexts.split(",")]
    all_ids = loaded.tokenizer.encode(text[: max(contexts) * 6])
    lay = loaded.config
    per_token = lay.num_layers * lay.num_kv_heads * 2 * lay.head_dim * 4  # float32 K and V
    rows = []
    for n in contexts:
        ids = all_ids[:n]
        t0 = time.perf_counter()
        eng = prefilled(loaded, ids, args.decode + args.check, args.block, args.chunk)
        print(f"prefilled {n:,} tokens in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        # Greedy agreement on a copy (the model weights are shared, not copied).
        twin = copy.deepcopy(eng, {id(loaded.model): loaded.model, id(loaded.tokenizer): None})
        twin.runner.in_place = False
        gathered = decode_tokens(twin, args.check)
        del twin
        in_place = decode_tokens(eng, args.check)
        agree = sum(a == b for a, b in zip(gathered, in_place, strict=True))
        spent = {True: 0.0, False: 0.0}
        steps = {True: 0, False: 0}
        load = os.getloadavg()[0]
        for i in range(args.decode):
            mode = i % 2 == 0
            eng.runner.in_place = mode
            t0 = time.perf_counter()
            eng.step()
            spent[mode] += time.perf_counter() - t0
            steps[mode] += 1
        row = {
            "context": n,
            "gather_ms_per_token": spent[False] / steps[False] * 1e3,
            "in_place_ms_per_token": spent[True] / steps[True] * 1e3,
            "gathered_bytes_per_token": (n + args.check) * per_token,
            "greedy_agree": f"{agree}/{args.check}",
            "default": "in place" if n >= DEFAULT_MIN else "gather",
            "load_1min": (load, os.getloadavg()[0]),
        }
        row["speedup"] = row["gather_ms_per_token"] / row["in_place_ms_per_token"]
        rows.append(row)
        del eng
    if args.json:
        print(json.dumps({"args": vars(args), "rows": rows}, indent=2))
        return
    print(
        f"full-cache decode, batch 1, block {args.block}, prefill chunk {args.chunk}, "
        f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs"
    )
    print(
        f"{'context':>8} {'gather ms/tok':>14} {'in place ms/tok':>16} {'speedup':>8} "
        f"{'gather copies/tok':>18} {'greedy':>7} {'load 1-min':>11}  default"
    )
    for r in rows:
        lo, hi = r["load_1min"]
        print(
            f"{r['context']:>8,} {r['gather_ms_per_token']:>14.1f} "
            f"{r['in_place_ms_per_token']:>16.1f} {r['speedup']:>7.2f}x "
            f"{r['gathered_bytes_per_token'] / 2**20:>14.1f} MiB {r['greedy_agree']:>7} "
            f"{lo:>5.1f}-{hi:.1f}  {r['default']}"
        )


if __name__ == "__main__":
    main()
