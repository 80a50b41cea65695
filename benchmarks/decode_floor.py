"""What a decode step costs without its kernels: the same engine step with the linear
layers' kernel calls, then the paged attention, then the small compiled kernels (norms,
SwiGLU, RoPE, cache writes) replaced by no-ops that return a buffer of the right shape.

The differences split the step into the linears (and the output head), the attention and
the rest; what is left at the end is the model's Python, torch's dispatch, scheduling,
sampling and detokenizing: what a compiled forward could take away. AMX formats only (their
linears all go through `gemv._tiles_call` or a `gemv.FixedCall`).

    .venv/bin/python benchmarks/decode_floor.py                       # int8, 4 x 150 tokens
    .venv/bin/python benchmarks/decode_floor.py --weights bf16 --batch 4 --context 576
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import ctxlab.engine.attention as attention
from ctxlab.engine import LLM, SamplingParams
from ctxlab.kv import row_write
from ctxlab.model import elementwise, gemv, norm_kernel


class NoKernel:
    """A loaded library whose every function does nothing."""

    def __getattr__(self, name: str):
        return lambda *args: 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="int8", choices=["bf16", "int8"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=150)
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not (gemv.amx() if a.weights == "bf16" else gemv.amx_int8()):
        raise SystemExit(f"{a.weights} runs AMX tiles only on a CPU with them; none here.")
    new_tokens = 4 * (a.steps + 1) + 8  # four timings of steps + 1, and the warm-up
    pool = a.batch * (a.context + new_tokens + 16)
    engine = LLM(weights=a.weights, kv_pool_tokens=pool).engine
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i in range(a.batch):
        engine.add_request(list(range(1000 + 7 * i, 1000 + 7 * i + a.context)), params)
    for _ in range(4):
        engine.step()

    def step_ms() -> float:
        engine.step()
        start = time.perf_counter()
        for _ in range(a.steps):
            engine.step()
        return (time.perf_counter() - start) / a.steps * 1e3

    buffers: dict[tuple, torch.Tensor] = {}

    def no_tiles(fn, x, tiles, scale, bias, tail=()):
        key = (tuple(x.shape), tiles.shape[0])
        if key not in buffers:
            buffers[key] = torch.zeros(*x.shape[:-1], tiles.shape[0])
        return buffers[key]

    def no_fixed(call: gemv.FixedCall, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), call.key)
        if key not in buffers:
            buffers[key] = torch.zeros(x.shape[0], call.out_features)
        return buffers[key]

    real = step_ms()
    gemv._tiles_call = no_tiles
    gemv.FixedCall.__call__ = no_fixed  # type: ignore[method-assign]
    no_linears = step_ms()
    attention.run_kernel = lambda q, pool, table, mask=None, length=None: torch.zeros(q.shape)
    no_attention = step_ms()
    for module in (norm_kernel, elementwise, row_write):
        module.kernel = NoKernel  # type: ignore[assignment]
    rest = step_ms()
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"{a.weights}, {a.batch} sequences of {a.context} tokens, 1 thread, load {load}")
    print("| part | ms a step | share |\n|---|---:|---:|")
    for name, ms in (
        ("linear layers and output head", real - no_linears),
        ("paged decode attention", no_linears - no_attention),
        ("norms, SwiGLU, RoPE, cache writes (compiled)", no_attention - rest),
        ("the rest: Python, dispatch, scheduling, sampling", rest),
        ("whole step", real),
    ):
        print(f"| {name} | {ms:.2f} | {ms / real:.0%} |")


if __name__ == "__main__":
    main()
