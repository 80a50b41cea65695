"""The decode attention alone: the numba paged kernel against the torch path, vs its memory floor.

    .venv/bin/python benchmarks/paged_decode_kernel.py                      # default shapes
    .venv/bin/python benchmarks/paged_decode_kernel.py --shapes 1x4096,1x16384 --kv float32
    .venv/bin/python benchmarks/paged_decode_kernel.py --shapes 1x512,4x576 --kv float32 --c

One step's attention of SmolLM2-135M (30 layers, 3 KV heads of 64, 9 query heads, 16-token
blocks): a pool holding `batch x context` tokens in every lane, its blocks handed out in a
scrambled order (as a long-running pool's are), random contents; `decode_attention` called
once per layer, as a step does, with the kernel (`numba`) and with the torch reference
(`torch`: gather + SDPA, or for long lanes main's in-place runs), interleaved, 1 thread,
best of `--reps` in CPU time. Beside each: the K and V bytes the step must read and the
floor they set at the read bandwidth measured here (a sum over 256 MiB), so the kernel's
own time can be read against its memory floor; `% of floor` = floor / time.

`--c` adds a third column for float32 pools: the same online-softmax loop written in C
(`C_LOOP` below, compiled here with `gcc -O3 -march=native -ffast-math`, with a software
prefetch of the lane's next block), called through ctypes on the pool in place. It is a
probe of what a compiled kernel would gain over the numba loop (docs/decode.md, issue 38),
not a path the engine takes; without gcc the column says so.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from decode_profile import best_cpu_ms

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
    paged_decode.set_enabled(attention == "numba")

    def step() -> None:
        for layer, t in enumerate(tables):
            r = runs[layer] if runs is not None else None
            decode_attention(q, pool, t, length=context, runs=r)

    return best_of(step, reps)


def best_of(step: Callable[[], object], reps: int) -> float:
    """Best CPU seconds of one `step` over `reps`, after a warm-up call."""
    step()
    return best_cpu_ms(step, 1, reps) / 1e3


C_LOOP = r"""
#include <math.h>
#include <stdint.h>
/* One lane per (sequence, KV head): the g queries' online softmax over the lane's blocks,
   K and V rows read in place from [blocks, bs, width]; the next block is prefetched. */
void decode_f32(const float *restrict q, const float *restrict kp, const float *restrict vp,
                const int64_t *restrict table, int lanes, int g, int d, int nb, int n, int bs,
                int width, float scale, float *restrict out) {
    float sc[8][256], qs[8][256], acc[8][256], m[8], den[8];
    for (int lane = 0; lane < lanes; lane++) {
        const int64_t *tb = table + (int64_t)lane * nb;
        for (int gi = 0; gi < g; gi++) {
            for (int c = 0; c < d; c++) {
                qs[gi][c] = q[((int64_t)lane * g + gi) * d + c] * scale;
                acc[gi][c] = 0.f;
            }
            m[gi] = -3e38f;
            den[gi] = 0.f;
        }
        int nbk = (n + bs - 1) / bs;
        for (int j = 0; j < nbk; j++) {
            const float *K = kp + tb[j] * bs * width, *V = vp + tb[j] * bs * width;
            if (j + 1 < nbk)
                for (int o = 0; o < bs * width; o += 16) {
                    __builtin_prefetch(kp + tb[j + 1] * bs * width + o, 0, 3);
                    __builtin_prefetch(vp + tb[j + 1] * bs * width + o, 0, 3);
                }
            int ns = n - j * bs < bs ? n - j * bs : bs;
            for (int gi = 0; gi < g; gi++) {
                float bmax = -3e38f;
                for (int s = 0; s < ns; s++) {
                    float dot = 0.f;
                    for (int c = 0; c < d; c++) dot += qs[gi][c] * K[s * width + c];
                    sc[gi][s] = dot;
                    bmax = dot > bmax ? dot : bmax;
                }
                if (bmax > m[gi]) {
                    float corr = expf(m[gi] - bmax);
                    den[gi] *= corr;
                    for (int c = 0; c < d; c++) acc[gi][c] *= corr;
                    m[gi] = bmax;
                }
                float tot = 0.f;
                for (int s = 0; s < ns; s++) {
                    float p = expf(sc[gi][s] - m[gi]);
                    sc[gi][s] = p;
                    tot += p;
                }
                den[gi] += tot;
                for (int s = 0; s < ns; s++)
                    for (int c = 0; c < d; c++) acc[gi][c] += sc[gi][s] * V[s * width + c];
            }
        }
        for (int gi = 0; gi < g; gi++)
            for (int c = 0; c < d; c++)
                out[((int64_t)lane * g + gi) * d + c] = acc[gi][c] / den[gi];
    }
}
"""


def compile_c_loop(folder: str) -> ctypes.CDLL | None:
    """`C_LOOP` built with gcc for this CPU (None without gcc)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    src, lib = Path(folder) / "loop.c", Path(folder) / "loop.so"
    src.write_text(C_LOOP)
    flags = ["-O3", "-march=native", "-ffast-math", "-fPIC", "-shared"]
    subprocess.run([gcc, *flags, "-o", str(lib), str(src), "-lm"], check=True)
    dll = ctypes.CDLL(str(lib))
    vp = ctypes.c_void_p
    dll.decode_f32.argtypes = [vp] * 4 + [ctypes.c_int] * 7 + [ctypes.c_float, vp]
    return dll


def run_c(dll: ctypes.CDLL, pool, table: torch.Tensor, q: torch.Tensor, context: int,
          out: np.ndarray) -> None:  # fmt: skip
    """One layer's attention through the C loop, into `out [B, n_kv, g, d]` (float32 pools)."""
    _, (k, v) = pool.decode_views()
    B, H, g, d = q.shape
    assert g <= 8 and d <= 256 and k.shape[1] <= 256, "C_LOOP's fixed buffers"
    qn, tb = q.contiguous().numpy(), table.contiguous().numpy()
    dll.decode_f32(qn.ctypes.data, k.ctypes.data, v.ctypes.data, tb.ctypes.data, B * H, g, d,
                   tb.shape[-1], context, k.shape[1], k.shape[2], d**-0.5,
                   out.ctypes.data)  # fmt: skip


def time_c_step(dll: ctypes.CDLL, pool, tables, q, context: int, reps: int) -> float:
    """`time_step` with the C loop (float32 pools): one call per layer, on the pool in place."""
    out = np.empty(q.shape, dtype=np.float32)
    return best_of(lambda: [run_c(dll, pool, t, q, context, out) for t in tables], reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x512,16x320,1x4096,1x16384", help="BATCHxCONTEXT list")
    ap.add_argument("--kv", default="float32,int8", help="pool formats: float32, bf16, int8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--c", action="store_true", help="also the C loop (float32 pools, gcc)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    bw = read_bandwidth()
    paged_decode.warm_up()
    with tempfile.TemporaryDirectory() as folder:
        dll = compile_c_loop(folder) if args.c else None
        if args.c and dll is None:
            print("--c: no gcc on this machine; the C column is left out")
        print(
            f"torch {torch.__version__}, 1 thread, read bandwidth {bw / 1e9:.1f} GB/s, "
            f"load {load()}; one step = 30 layers' decode attention"
        )
        c_head = " C ms | % of floor | C / numba speed-up (max abs diff) |" if dll else ""
        print(
            "\n| KV | batch x context | KV read / step | floor ms | numba ms | % of floor | "
            f"torch ms | % of floor | numba / torch speed-up |{c_head} load |"
        )
        print("|---|---|---|---|---|---|---|---|---|" + ("---|" * 3 if dll else "") + "---|")
        for kv in args.kv.split(","):
            for shape in args.shapes.split(","):
                batch, context = (int(x) for x in shape.split("x"))
                pool, tables, runs, q = step_case(batch, context, kv)
                nbytes = batch * context * LAYERS * N_KV * pool.block_bytes // BS
                floor = nbytes / bw
                best = {"numba": float("inf"), "torch": float("inf"), "C": float("inf")}
                with_c = dll is not None and kv == "float32"
                for _ in range(2):  # interleaved rounds
                    for a in ("numba", "torch"):
                        t = time_step(pool, tables, runs, q, context, a, args.reps)
                        best[a] = min(best[a], t)
                    if with_c:
                        t = time_c_step(dll, pool, tables, q, context, args.reps)
                        best["C"] = min(best["C"], t)
                c_cells = ""
                if with_c:
                    diff = c_difference(dll, pool, tables, q, context)
                    c_cells = (
                        f" {best['C'] * 1e3:.2f} | {floor / best['C']:.0%} | "
                        f"{best['numba'] / best['C']:.2f}x ({diff:.1e}) |"
                    )
                elif dll is not None:
                    c_cells = " - | - | - |"
                print(
                    f"| {kv} | {batch} x {context} | {nbytes / 2**20:.1f} MiB | "
                    f"{floor * 1e3:.2f} | {best['numba'] * 1e3:.2f} | "
                    f"{floor / best['numba']:.0%} | "
                    f"{best['torch'] * 1e3:.2f} | {floor / best['torch']:.0%} | "
                    f"{best['torch'] / best['numba']:.2f}x |{c_cells} {load()} |",
                    flush=True,
                )
                del pool, tables, runs
    paged_decode.set_enabled(None)


def c_difference(dll: ctypes.CDLL, pool, tables, q, context: int) -> float:
    """Largest |C loop - engine kernel| over the first layer's output (the C loop must compute
    the same attention for its time to mean anything)."""
    out = np.empty(q.shape, dtype=np.float32)
    run_c(dll, pool, tables[0], q, context, out)
    paged_decode.set_enabled(True)
    want, _ = decode_attention(q, pool, tables[0], length=context)
    return float((torch.from_numpy(out) - want.reshape(out.shape)).abs().max())


if __name__ == "__main__":
    main()
