"""The decode attention alone: ctxlab's C and numba paged loops against the torch path, vs the
memory floor.

    .venv/bin/python benchmarks/paged_decode_kernel.py                      # default shapes
    .venv/bin/python benchmarks/paged_decode_kernel.py --shapes 1x4096,1x16384 --kv float32
    .venv/bin/python benchmarks/paged_decode_kernel.py --shapes 1x512,4x576 --kv float32,bf16,int8

One step's attention of SmolLM2-135M (30 layers, 3 KV heads of 64, 9 query heads, 16-token
blocks): a pool holding `batch x context` tokens in every lane, its blocks handed out in a
scrambled order (as a long-running pool's are), random contents; `decode_attention` called
once per layer, as a step does, with each implementation (`CTXLAB_DECODE_KERNEL`'s choices:
the C loops `c`, where a C compiler built them, numba's `numba`, and the torch reference
`torch`: gather + SDPA, or for long lanes the in-place runs), interleaved, 1 thread, best of
`--reps` in CPU time. Beside each: the K and V bytes the step must read and the floor they
set at the read bandwidth measured here (a sum over 256 MiB), so a loop's own time can be
read against its memory floor; `% of floor` = floor / time. The last column is the largest
difference between the C and numba outputs over the first layer.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from decode_profile import best_cpu_ms

from ctxlab import native
from ctxlab.engine.decode_attention import decode_attention
from ctxlab.engine.kernels import paged_decode
from ctxlab.engine.lane_runs import plan_runs
from ctxlab.kv import KVLayout, KVPool, QuantKVPool

LAYERS, N_KV, GROUP, D, BS = 30, 3, 3, 64, 16


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def read_bandwidth() -> float:
    """Bytes per CPU second of a sum over 256 MiB, best of 5 (CPU time, as the steps)."""
    x = torch.ones(64 * 2**20)
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        x.sum()
        best = min(best, time.process_time() - t)
    return x.numel() * 4 / best


def step_case(batch: int, context: int, kv: str):
    """A pool, per-layer tables `[B, n_kv, nb]`, the in-place runs and the queries."""
    dtype = torch.bfloat16 if kv == "bf16" else torch.float32
    lay = KVLayout(LAYERS, N_KV, D, D, block_size=BS, dtype=dtype)
    nb = -(-context // BS)
    n_blocks = batch * LAYERS * N_KV * nb
    gen = torch.Generator().manual_seed(0)
    if kv == "int8":
        pool = QuantKVPool(lay, n_blocks, "int8")
        for a in range(0, n_blocks, 4096):  # written in chunks: quantized as the engine does
            ids = torch.arange(a, min(a + 4096, n_blocks))
            rows = ids[:, None] * BS + torch.arange(BS)
            pool.write(rows, torch.randn(*rows.shape, D), torch.randn(*rows.shape, D))
    else:
        pool = KVPool(lay, n_blocks)
        pool.data.normal_(generator=gen)
    # blocks of a lane in a scrambled order, except runs of 8 adjacent ones (a long-running
    # pool hands out freed blocks in small runs)
    perm = torch.randperm(n_blocks // 8, generator=gen)
    order = (perm[:, None] * 8 + torch.arange(8)).flatten()
    order = torch.cat((order, torch.arange(len(order), n_blocks)))
    table = order.view(batch, LAYERS * N_KV, nb)  # [B, lanes, nb]
    runs = plan_runs(table, context, LAYERS, N_KV, BS) if kv != "int8" else None
    q = torch.randn(batch, N_KV, GROUP, D, generator=gen).to(dtype)
    per_layer = [table[:, layer * N_KV : (layer + 1) * N_KV].contiguous() for layer in range(30)]
    return pool, per_layer, runs, q


def time_step(pool, tables, runs, q, context: int, attention: str, reps: int) -> float:
    paged_decode.set_enabled(attention)

    def step() -> None:
        for layer, t in enumerate(tables):
            r = runs[layer] if runs is not None else None
            decode_attention(q, pool, t, length=context, runs=r)

    return best_of(step, reps)


def best_of(step: Callable[[], object], reps: int) -> float:
    """Best CPU seconds of one `step` over `reps`, after a warm-up call."""
    step()
    return best_cpu_ms(step, 1, reps) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x512,16x320,1x4096,1x16384", help="BATCHxCONTEXT list")
    ap.add_argument("--kv", default="float32,int8", help="pool formats: float32, bf16, int8")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    bw = read_bandwidth()
    paged_decode.warm_up()
    paged_decode.set_enabled("c")
    impls = ["c", "numba", "torch"] if paged_decode.backend() == "c" else ["numba", "torch"]
    if "c" not in impls:
        print(f"no C loops here ({native.why_not('paged_decode')}); their columns are left out")
    print(
        f"torch {torch.__version__}, 1 thread, read bandwidth {bw / 1e9:.1f} GB/s, "
        f"load {load()}; one step = 30 layers' decode attention"
    )
    head = "".join(f" {a} ms | % of floor |" for a in impls)
    ratios = " C / numba | numba / torch | max abs diff C - numba |" if "c" in impls else ""
    ratios = ratios or " numba / torch |"
    print(f"\n| KV | batch x context | KV read / step | floor ms |{head}{ratios} load |")
    print("|---|---|---|---|" + "---|" * (2 * len(impls) + ratios.count("|")) + "---|")
    for kv in args.kv.split(","):
        for shape in args.shapes.split(","):
            batch, context = (int(x) for x in shape.split("x"))
            pool, tables, runs, q = step_case(batch, context, kv)
            nbytes = batch * context * LAYERS * N_KV * pool.block_bytes // BS
            floor = nbytes / bw
            best = dict.fromkeys(impls, float("inf"))
            for _ in range(2):  # interleaved rounds
                for a in impls:
                    best[a] = min(best[a], time_step(pool, tables, runs, q, context, a, args.reps))
            cells = "".join(f" {best[a] * 1e3:.2f} | {floor / best[a]:.0%} |" for a in impls)
            if "c" in impls:
                diff = c_difference(pool, tables, q, context)
                cells += (
                    f" {best['numba'] / best['c']:.2f}x | {best['torch'] / best['numba']:.2f}x |"
                    f" {diff:.1e} |"
                )
            else:
                cells += f" {best['torch'] / best['numba']:.2f}x |"
            print(
                f"| {kv} | {batch} x {context} | {nbytes / 2**20:.1f} MiB | "
                f"{floor * 1e3:.2f} |{cells} {load()} |",
                flush=True,
            )
            del pool, tables, runs
    paged_decode.set_enabled(None)


def c_difference(pool, tables, q, context: int) -> float:
    """Largest |C - numba| over the first layer's output (the two must compute the same
    attention for their times to mean anything)."""
    got = {}
    for a in ("c", "numba"):
        paged_decode.set_enabled(a)
        got[a], _ = decode_attention(q, pool, tables[0], length=context)
    return float((got["c"].float() - got["numba"].float()).abs().max())


if __name__ == "__main__":
    main()
