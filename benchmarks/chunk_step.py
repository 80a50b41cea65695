"""A prefill chunk after a cached prefix, with its attention on AMX tiles and on gather + SDPA.

Two figures, each side by side in one process with the two paths alternating:
- the attention alone at the model's shapes (its query heads over its KV heads, `--chunk`
  queries after `--prefix` cached keys), from a float32 pool: `chunk_attention.attend` against
  the pool's gather, the conversion to bf16 and SDPA (what `PagedAttention._chunk` does
  without the kernel);
- a mixed engine step: `--decoding` sequences decoding while a new request's `--chunk`-token
  suffix runs after a `--prefix`-token prefix already cached, with the kernel on and off
  (`PagedAttention._chunk_tiles`), medians of `--steps` steps each.

    .venv/bin/python benchmarks/chunk_step.py                     # int8, 64 after 512
    .venv/bin/python benchmarks/chunk_step.py --weights bf16 --prefix 1024
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from ctxlab.engine import LLM, SamplingParams
from ctxlab.engine.kernels import chunk_attention
from ctxlab.kv.layout import KVLayout
from ctxlab.kv.pool import KVPool
from ctxlab.model import gemv


def attention_alone(n_kv: int, group: int, d: int, chunk: int, prefix: int, reps: int) -> str:
    layout = KVLayout(n_layers=1, n_kv_heads=n_kv, head_dim=d, head_dim_v=d)
    nb = -(-(prefix + chunk) // layout.block_size)
    pool = KVPool(layout, nb * n_kv + 8)
    pool.data.normal_()
    table = torch.randperm(pool.num_blocks)[: nb * n_kv].view(n_kv, nb)
    q = torch.randn(n_kv, group * chunk, d).to(torch.bfloat16)
    keys = nb * layout.block_size
    hi = (prefix + torch.arange(1, chunk + 1)).repeat(group).expand(n_kv, group * chunk)
    mask = torch.arange(keys).view(1, 1, keys) < hi.unsqueeze(-1)
    bias = torch.zeros(1, *mask.shape, dtype=torch.bfloat16).masked_fill_(~mask, float("-inf"))

    def sdpa() -> None:
        k, v = pool.gather(table)
        kv = (k.bfloat16().unsqueeze(0), v.bfloat16().unsqueeze(0))
        F.scaled_dot_product_attention(q.unsqueeze(0), *kv, attn_mask=bias)

    def tiles() -> None:
        chunk_attention.attend(q, pool, table, span=(torch.zeros_like(hi), hi))

    times: dict[str, list[float]] = {"sdpa": [], "tiles": []}
    for _ in range(reps):
        for name, fn in (("sdpa", sdpa), ("tiles", tiles)):
            fn()
            start = time.perf_counter()
            for _ in range(20):
                fn()
            times[name].append((time.perf_counter() - start) / 20 * 1e6)
    s, t = (statistics.median(times[k]) for k in ("sdpa", "tiles"))
    return (
        f"attention, {group * chunk} query rows x {n_kv} KV heads over {keys} keys: "
        f"gather + bf16 + SDPA {s:.0f} us, tiles {t:.0f} us ({s / t:.2f}x; medians of {reps})"
    )


def mixed_steps(weights: str, prefix: int, chunk: int, decoding: int, steps: int) -> str:
    engine = LLM(weights=weights, kv_pool_tokens=(prefix + 2 * chunk) * (decoding + 2) * 4).engine
    backend = engine.runner.backend
    if not backend._chunk_tiles:
        raise SystemExit("the engine keeps chunks on SDPA here (its log says why)")
    cached = list(range(2000, 2000 + prefix))
    long = SamplingParams(max_tokens=100_000, temperature=0.0, ignore_eos=True)
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for i in range(decoding):
        engine.add_request(cached + list(range(30_000 + chunk * i, 30_000 + chunk * (i + 1))), long)
    for _ in range(8):
        engine.step()
    gen = torch.Generator().manual_seed(0)
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(steps):
        for tiles in (True, False):
            backend._chunk_tiles = tiles
            suffix = torch.randint(100, 40_000, (chunk,), generator=gen).tolist()
            engine.add_request(cached + suffix, one)
            start = time.perf_counter()
            engine.step()
            times[tiles].append((time.perf_counter() - start) * 1e3)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return (
        f"mixed step ({weights}, {decoding} decoding + a {chunk}-token chunk after a cached "
        f"{prefix}): SDPA {off:.1f} ms (range {min(times[False]):.1f}-{max(times[False]):.1f}), "
        f"tiles {on:.1f} ms ({min(times[True]):.1f}-{max(times[True]):.1f}); "
        f"{off / on:.2f}x, n = {steps} each"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="int8", choices=["bf16", "int8"])
    ap.add_argument("--prefix", type=int, default=512, help="cached tokens before the chunk")
    ap.add_argument("--chunk", type=int, default=64, help="the new request's own tokens")
    ap.add_argument("--decoding", type=int, default=3, help="sequences decoding beside it")
    ap.add_argument("--steps", type=int, default=11, help="mixed steps timed per path")
    a = ap.parse_args()
    if min(a.prefix, a.chunk, a.steps) < 1 or a.decoding < 0:
        raise SystemExit("--prefix, --chunk and --steps must be positive, --decoding >= 0.")
    torch.set_num_threads(1)
    if chunk_attention.library() is None:
        raise SystemExit("the chunk attention runs on AMX bf16 tiles; this CPU has none.")
    if not (gemv.amx() if a.weights == "bf16" else gemv.amx_int8()):
        raise SystemExit(f"{a.weights} runs AMX tiles only on a CPU with them; none here.")
    print(attention_alone(3, 3, 64, a.chunk, a.prefix, reps=7))  # SmolLM2-135M's heads
    print(mixed_steps(a.weights, a.prefix, a.chunk, a.decoding, a.steps))


if __name__ == "__main__":
    main()
