"""What a decode step costs without its kernels: the same engine step with the linear
layers' kernel calls, then the paged attention, then the small compiled kernels (norms,
SwiGLU, RoPE, cache writes) replaced by no-ops that return a buffer of the right shape.

The differences split the step into the linears (and the output head), the attention and
the rest; what is left is the Python, split last by replacing each decoder layer with a
no-op: the layers' Python and torch's dispatch (what a compiled forward could take away),
then the engine's own (scheduling, the step plan, sampling, the embedding and the head's
Python). The split runs each layer through its Python path; the last line sets the same
step through the compiled decode block (`ctxlab/model/decode_block.c`), which takes the
layers' Python away, against that path. AMX formats only (their
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
from ctxlab.model import decode_block, elementwise, gemv, norm_kernel


class NoKernel:
    """A loaded library whose every function does nothing."""

    def __getattr__(self, name: str):
        return lambda *args: 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="int8", choices=["bf16", "int8"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=150)
    ap.add_argument("--steps", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not (gemv.amx() if a.weights == "bf16" else gemv.amx_int8()):
        raise SystemExit(f"{a.weights} runs AMX tiles only on a CPU with them; none here.")
    new_tokens = 8 * (a.steps + 1) + 8  # eight timings of steps + 1, and the warm-up
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

    # the split below runs each layer through its Python path (the compiled decode block
    # calls the kernels from C, where no stub reaches them); the step through the block is
    # timed between two timings of that path, whose mean it is set against (the context,
    # and with it the attention, grows from one timing to the next)
    block_kernel = decode_block.kernel
    python_path = [0.0, 0.0]
    for turn in range(3):
        decode_block.kernel = block_kernel if turn == 1 else lambda: None  # type: ignore[assignment]
        for layer in engine.model.layers:
            layer.__dict__.pop("_decode_block", None)
        if turn == 1:
            with_block = step_ms()
        else:
            python_path[turn // 2] = step_ms()
    real = step_ms()
    gemv._tiles_call = no_tiles
    gemv.FixedCall.__call__ = no_fixed  # type: ignore[method-assign]
    no_linears = step_ms()
    attention.run_kernel = lambda q, pool, table, mask=None, length=None: torch.zeros(q.shape)
    no_attention = step_ms()
    for module in (norm_kernel, elementwise, row_write):
        module.kernel = NoKernel  # type: ignore[assignment]
    row_write.RowWriter.write = lambda self, rows, k, v: True  # type: ignore[method-assign]
    rest = step_ms()
    for layer in engine.model.layers:  # the decoder layers' Python out too
        layer.forward = lambda x, cos, sin, backend: x
    engine_only = step_ms()
    load = Path("/proc/loadavg").read_text().split()[0]
    grown = a.context + 4 + 8 * (a.steps + 1)
    print(f"{a.weights}, {a.batch} sequences of {a.context} to {grown} tokens over the run, "
          f"1 thread, load {load}")  # fmt: skip
    print("| part | ms a step | share |\n|---|---:|---:|")
    for name, ms in (
        ("linear layers and output head", real - no_linears),
        ("paged decode attention", no_linears - no_attention),
        ("norms, SwiGLU, RoPE, cache writes (compiled)", no_attention - rest),
        ("the decoder layers' Python and torch dispatch", rest - engine_only),
        ("the engine around the forward: scheduling, plan, sampling", engine_only),
        ("whole step", real),
    ):
        print(f"| {name} | {ms:.2f} | {ms / real:.0%} |")
    around = sum(python_path) / 2
    print(
        f"\nthe compiled decode block: {with_block:.2f} ms a step against {around:.2f} through "
        f"the layers' Python path (timed before and after it): {with_block / around:.3f}x"
    )


if __name__ == "__main__":
    main()
