"""Eager against `torch.compile`d (inductor) decode steps of the engine, side by side (issue 38).

    .venv/bin/python benchmarks/compiled_decode.py --formats fp32,int8 --batches 1,16
    .venv/bin/python benchmarks/compiled_decode.py --formats fp32 --batches 1 --cache-dir /tmp/x

A prototype measurement, not an engine option: the engine's own decode steps (`LLMEngine
.step()`, paged KV pool, numba decode attention), with the model's forward swapped per step
between the eager module and a compiled version of its decoder layers. In the compiled one
the paged attention is a `torch.library.custom_op` the graph calls (the graph cannot see the
pool, the step plan or numba; the op calls the engine's real attention backend), so the
~4,000 small operators and the Python around them are what inductor may fuse or remove.
Embedding and RoPE tables stay eager (outside the graph), as does the logits head.

Each (format, batch) engine decodes `batch` sequences of `--context` tokens; the first
compiled call of each shape compiles (timed: cold, and again in a fresh process with a warm
on-disk cache when `--cache-dir` is given twice in a row); then eager and compiled steps are
timed interleaved, best of `--reps` rounds of `--steps` steps, CPU time of this process, 1
thread; graph breaks are counted (0 means one graph per shape). Exactness is not checked
here (a prototype: see docs/decode.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from _serving import load_average
from decode_profile import best_cpu_ms, start_decoding

from ctxlab.cache_dir import cache_root
from ctxlab.engine import LLM
from ctxlab.model import layers as model_layers
from ctxlab.model import qlinear
from ctxlab.model.layers import rope_tables

_BACKEND: list = [None]  # the engine's attention backend for the forward in flight


@torch.library.custom_op("ctxlab_bench::attend", mutates_args=())
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """The engine's attention for one layer (writes K and V to the pool, reads the cache)."""
    out = _BACKEND[0].attend(layer, q, k, v)
    return out.clone() if out.data_ptr() == q.data_ptr() else out


@attend.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1], v.shape[-1])


class OpBackend:
    """What the compiled layers see as their backend: the custom op."""

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        return torch.ops.ctxlab_bench.attend(q, k, v, layer_idx)


_PACKED: list = []  # (fbgemm's packed int8 weights, width) by index: a graph cannot hold them


@torch.library.custom_op("ctxlab_bench::int8_linear", mutates_args=())
def int8_linear(x: torch.Tensor, handle: int, reduce_range: bool) -> torch.Tensor:
    """fbgemm's dynamic int8 linear on float32 rows, per-token scales (`Int8Linear`)."""
    packed = _PACKED[handle][0]
    if x.shape[0] == 1:
        return torch.ops.quantized.linear_dynamic(x, packed, reduce_range)
    return qlinear._per_token_int8(x, packed, reduce_range)


@int8_linear.register_fake
def _(x: torch.Tensor, handle: int, reduce_range: bool) -> torch.Tensor:
    return x.new_empty(x.shape[0], _PACKED[handle][1])


_EAGER_INT8 = qlinear.Int8Linear.forward


def _int8(self, x: torch.Tensor) -> torch.Tensor:
    # fbgemm's op takes a packed-weights object dynamo cannot trace: a graph break per
    # linear (121 a step); as an opaque custom op it stays one node of the graph
    if not torch.compiler.is_compiling():
        return _EAGER_INT8(self, x)
    y = torch.ops.ctxlab_bench.int8_linear(x.float(), self._handle, self.reduce_range)
    return self._out(y, x)


_EAGER_NORM = model_layers.RMSNorm.forward


def _norm(self, x: torch.Tensor) -> torch.Tensor:
    # the eager norm's one-token layer_norm trick keys a cache on data_ptr(), which dynamo
    # cannot trace; inside a graph plain rms_norm is what inductor fuses
    if torch.compiler.is_compiling():
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)
    return _EAGER_NORM(self, x)


class Subject:
    def __init__(self, fmt: str, batch: int, context: int, steps: int) -> None:
        self.llm = LLM(
            weights=fmt,
            kv_pool_tokens=batch * (context + steps + 128),
            enable_prefix_caching=False,
        )
        self.engine = self.llm.engine
        self.model = self.llm.loaded.model
        model = self.model
        self.eager = model.forward
        for mod in model.modules():  # handles for the int8 op, set before any tracing
            if isinstance(mod, qlinear.Int8Linear):
                mod._handle = len(_PACKED)
                _PACKED.append((mod._packed, mod.out_features))
        op = OpBackend()

        def body(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            for layer in model.layers:
                x = layer.forward(x, cos, sin, op)
            return model.norm(x)

        self.compiled_body = torch.compile(body, dynamic=False, fullgraph=False)

        def compiled(input_ids, positions, backend):
            if input_ids.shape[0] != batch:  # prefill: eager
                return self.eager(input_ids, positions, backend)
            _BACKEND[0] = backend
            x = model.embed_tokens(input_ids)
            cos, sin = rope_tables(*model.rope.cos_sin(positions, x.dtype))
            return self.compiled_body(x, cos, sin)

        self.compiled = compiled
        self.rids = start_decoding(self.engine, batch, context, steps + 64)

    def use(self, compiled: bool) -> None:
        self.model.forward = self.compiled if compiled else self.eager

    def step(self) -> None:
        self.engine.step()


@torch.inference_mode()
def check(s: Subject, steps: int) -> None:
    """Greedy decode of one prompt by the eager and the compiled forward, each on its own
    dense cache (the same prefill, eager): the largest logit difference while the two texts
    are the same, and the first step where the argmax differs."""
    from ctxlab.model import DenseBackend

    model = s.model
    prompt = list(range(2000, 2064))
    backends = {name: DenseBackend.for_model(model) for name in ("eager", "compiled")}
    tokens, worst, parted = {}, 0.0, None
    for name, be in backends.items():
        be.set_batch([0], [0, len(prompt)])
        hidden = s.eager(torch.tensor(prompt), torch.arange(len(prompt)), be)
        tokens[name] = int(model.compute_logits(hidden[-1:]).argmax())
    for i in range(steps):
        logits = {}
        for name, be in backends.items():
            be.set_batch([0], [0, 1])
            fwd = s.compiled if name == "compiled" else s.eager
            pos = torch.tensor([len(prompt) + i])
            logits[name] = model.compute_logits(fwd(torch.tensor([tokens[name]]), pos, be))
            tokens[name] = int(logits[name].argmax())
        if parted is None:  # after the texts part, the inputs differ: not compared
            worst = max(worst, float((logits["eager"] - logits["compiled"]).abs().max()))
            if tokens["eager"] != tokens["compiled"]:
                parted = i
    print(
        f"  check, {steps} greedy steps: max |logit diff| {worst:.2e} (until they part); tokens "
        f"{'identical' if parted is None else f'part at step {parted}'}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="fp32,int8")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cache-dir", default=None, help="inductor's cache (default: ctxlab's)")
    ap.add_argument(
        "--check", type=int, default=0, help="greedy steps compared eager vs compiled (batch 1)"
    )
    args = ap.parse_args()
    cache = Path(args.cache_dir) if args.cache_dir else cache_root() / "inductor"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache))
    model_layers.RMSNorm.forward = _norm
    qlinear.Int8Linear.forward = _int8
    torch.set_num_threads(1)
    from torch._dynamo.utils import counters

    print(
        f"torch {torch.__version__}, 1 thread, capability "
        f"{torch.backends.cpu.get_cpu_capability()}, context {args.context}, inductor cache "
        f"{cache} ({'warm' if cache.is_dir() and any(cache.iterdir()) else 'cold'}), "
        f"load {load_average()}"
    )
    rows = []
    for fmt in args.formats.split(","):
        for b in (int(x) for x in args.batches.split(",")):
            steps = 2 * args.reps * args.steps + 8
            s = Subject(fmt, b, args.context, steps)
            s.use(True)
            breaks = sum(counters["graph_break"].values())
            t0, c0 = time.perf_counter(), time.process_time()
            s.step()  # the first compiled call compiles (or loads from the cache)
            first = (time.perf_counter() - t0, time.process_time() - c0)
            breaks = sum(counters["graph_break"].values()) - breaks
            eager_ms = compiled_ms = float("inf")
            for _ in range(2):
                s.use(False)
                eager_ms = min(eager_ms, best_cpu_ms(s.step, args.steps, args.reps))
                s.use(True)
                compiled_ms = min(compiled_ms, best_cpu_ms(s.step, args.steps, args.reps))
            s.use(False)
            if args.check and b == 1:
                check(s, args.check)
            rows.append((fmt, b, eager_ms, compiled_ms, first, breaks))
            print(
                f"| {fmt} | {b} | {eager_ms:.1f} | {compiled_ms:.1f} | "
                f"{eager_ms / compiled_ms:.2f}x | {first[0]:.1f} s wall ({first[1]:.1f} s CPU) | "
                f"{breaks} | {load_average()} |",
                flush=True,
            )
            del s


if __name__ == "__main__":
    main()
