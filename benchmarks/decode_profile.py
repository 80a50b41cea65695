"""Where the time of one decode step goes, per weight format, at 1 thread (batch 1 or more).

    .venv/bin/python benchmarks/decode_profile.py                  # fp32, int8, int4
    .venv/bin/python benchmarks/decode_profile.py --formats int8 --top 20
    .venv/bin/python benchmarks/decode_profile.py --formats int8,int4 --batch 16 --context 320
    .venv/bin/python benchmarks/decode_profile.py --model gemma3-270m --formats fp32,int4
    .venv/bin/python benchmarks/decode_profile.py --formats int8 --attention c,numba,torch
    .venv/bin/python benchmarks/decode_profile.py --formats fp32,bf16,int8,int4 --context 2048

`--attention c,numba,torch` runs every format once per attention, side by side in one
process: with the compiled paged decode attention (ctxlab/engine/kernels: its C or numba
loops) and with the torch reference (gather + SDPA), switched per call on the same engine.

For each format, after a 512-token prompt, three nested timings of one step, interleaved
across formats (best of `--reps` rounds of `--steps` steps, CPU time of this process):
- linears: only the step's linear layers and output head, called back to back on one token
  (what the weights' bytes cost through this format's kernel, with no Python around them);
- forward: the model's forward pass and logits with a no-op attention (adds the norms,
  RoPE, residual adds and each module's Python);
- engine step: `LLMEngine.step()` (adds the paged decode attention over the real cache,
  scheduling, the step plan, sampling, bookkeeping).
Then one `torch.profiler` pass over `--steps` engine steps: self CPU time per operator per
step, and their sum, against the unprofiled step: the difference is the interpreter and the
dispatcher (the profiler adds some of its own, so the kernel share is an upper bound); and
the step's own split: linear kernels, attention, other operators, Python and dispatch.
Beside them: the memory roofline of the step's weight bytes at the read bandwidth measured
here, the floor a decode step could reach if only the weights' bytes cost time, and the
roofline of weights + the KV the step reads (every sequence's K and V in every layer).
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
from _serving import load_average
from torch.profiler import ProfilerActivity, profile

from ctxlab.engine import LLM, SamplingParams
from ctxlab.engine.kernels import paged_decode
from ctxlab.model import gemv
from ctxlab.model.weights import LINEARS, step_weight_bytes


def start_decoding(engine, batch: int, context: int, max_tokens: int) -> list[int]:
    """`batch` greedy sequences of `context` prompt tokens, stepped until each has its first
    output token (so the next steps are decode steps); their request ids."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    rids = [
        engine.add_request(list(range(1000 + i, 1000 + i + context)), params) for i in range(batch)
    ]
    while any(engine.seqs[r].metrics.output_tokens == 0 for r in rids):
        engine.step()
    return rids


class NoAttention:
    """An attention backend that returns the queries: the model's work without attention."""

    def attend(self, layer_idx, q, k, v):
        return q


def linears_of(model) -> list[tuple[torch.nn.Module, int]]:
    out = []
    for layer in model.layers:
        for name in LINEARS:
            owner, attr = name.split(".")
            mod = getattr(getattr(layer, owner), attr)
            width = mod.in_features if hasattr(mod, "in_features") else mod.inner.in_features
            out.append((mod, width))
    head = model.output
    out.append((head, model.config.hidden_size) if head is not None else (None, 0))
    return out


def best_cpu_ms(fn, steps: int, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.process_time()
        for _ in range(steps):
            fn()
        best = min(best, (time.process_time() - start) / steps)
    return best * 1e3


def read_bandwidth() -> float:
    x = torch.ones(64 * 2**20)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best


class Subject:
    """One format's engine with a 512-token sequence decoding, and its timed callables."""

    def __init__(
        self, fmt: str, context: int, batch: int, steps: int, model: str = "smollm2-135m"
    ) -> None:
        self.llm = LLM(
            model,
            weights=fmt,
            kv_pool_tokens=batch * (context + steps + 64),
            enable_prefix_caching=False,
        )
        self.engine = self.llm.engine
        model = self.llm.loaded.model
        self.model = model
        start_decoding(self.engine, batch, context, steps + 32)
        self.token = torch.full((batch,), 5)
        self.pos = torch.full((batch,), context)
        self.lins = linears_of(model)
        self.xs = {w: torch.randn(batch, w) for _, w in self.lins if w}
        self.null = NoAttention()
        hidden = model.config.hidden_size
        if model.output is None:  # fp32: the tied table is the head
            table = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
            self.lins[-1] = (lambda x, t=table: gemv.linear(x, t), hidden)  # as compute_logits
            self.xs[hidden] = torch.randn(batch, hidden)

    def kv_bytes(self) -> int:
        """K and V bytes a decode step reads: every live sequence's lanes in every layer."""
        pool = self.engine.kv.pool
        tokens = sum(s.num_tokens for s in self.engine.seqs.values() if not s.finished)
        lay = pool.layout
        return tokens * lay.n_layers * lay.n_kv_heads * pool.block_bytes // lay.block_size

    def linears(self) -> None:
        for mod, width in self.lins:
            (mod.forward if hasattr(mod, "forward") else mod)(self.xs[width])

    def forward(self) -> None:
        self.model.compute_logits(self.model.forward(self.token, self.pos, self.null))

    def step(self) -> None:
        self.engine.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="fp32,int8,int4")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1, help="sequences decoding together")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m or gemma3-270m")
    ap.add_argument(
        "--attention",
        default="auto",
        help="decode attention(s) to time, side by side: auto (the C loops where built, else "
        "numba's), c, numba, torch (the reference)",
    )
    args = ap.parse_args()
    attentions = args.attention.split(",")
    torch.set_num_threads(args.threads)
    bandwidth = read_bandwidth()
    steps = 2 * args.reps * args.steps + args.steps  # every engine step the script takes
    steps *= len(attentions)
    engines = {
        f: Subject(f, args.context, args.batch, steps, args.model) for f in args.formats.split(",")
    }
    subjects = {f"{f} / {a}": (s, a) for f, s in engines.items() for a in attentions}
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, "
        f"context {args.context}, "
        f"read bandwidth {bandwidth / 1e9:.1f} GB/s, load {load_average()}"
    )

    def using(attention: str, fn):
        def run() -> None:
            paged_decode.set_enabled(attention)
            fn()

        return run

    rows = {f: {} for f in subjects}
    for _ in range(2):  # two interleaved rounds; the best of both is kept
        for f, (s, a) in subjects.items():
            for name, fn in (("linears", s.linears), ("forward", s.forward), ("step", s.step)):
                ms = best_cpu_ms(using(a, fn), args.steps, args.reps)
                rows[f][name] = min(ms, rows[f].get(name, float("inf")))
    print(
        "\n| format / attention | weights read / step | KV read / step | roofline ms "
        "(weights / + KV) | linears ms | forward, no attention ms | engine step ms | "
        "attention + rest ms | step / roofline (weights + KV) | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for f, (s, _a) in subjects.items():
        nbytes = step_weight_bytes(s.model)
        kv = s.kv_bytes()
        roof = nbytes / bandwidth * 1e3
        roof_kv = (nbytes + kv) / bandwidth * 1e3
        r = rows[f]
        print(
            f"| {f} | {nbytes / 2**20:.0f} MiB | {kv / 2**20:.1f} MiB | {roof:.1f} / "
            f"{roof_kv:.1f} | {r['linears']:.1f} | {r['forward']:.1f} | {r['step']:.1f} | "
            f"{r['step'] - r['forward']:.1f} | {r['step'] / roof_kv:.2f}x "
            f"({roof_kv / r['step']:.0%}) | {load_average()} |"
        )
    splits = []
    for f, (s, a) in subjects.items():
        paged_decode.set_enabled(a)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                s.step()
        events = prof.key_averages()
        ops = [e for e in events if not e.key.startswith(("ProfilerStep", "[memory]"))]
        total_us = sum(e.self_cpu_time_total for e in ops) / args.steps
        print(
            f"\n### {f}: operators per decode step (profiled; unprofiled step "
            f"{rows[f]['step']:.1f} ms, operators' self time {total_us / 1e3:.1f} ms, "
            f"so {max(0.0, rows[f]['step'] - total_us / 1e3):.1f} ms or more is Python and "
            f"dispatch; load {load_average()})"
        )
        print("| operator | calls / step | self CPU ms / step | share of operator time |")
        print("|---|---|---|---|")
        ops.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
        for e in ops[: args.top]:
            us = e.self_cpu_time_total / args.steps
            print(
                f"| {e.key} | {e.count / args.steps:.0f} | {us / 1e3:.2f} | {us / total_us:.0%} |"
            )
        calls = sum(e.count for e in ops) / args.steps
        print(f"| (all {len(ops)} operators) | {calls:.0f} | {total_us / 1e3:.2f} | 100% |")
        splits.append((f, rows[f]["step"], split(ops, args.steps)))
    print(
        "\n### The step's own time split. CPU ms (unprofiled): linears alone, the rest of the "
        "forward (norms, RoPE, small operators and the model's Python), and attention + engine "
        "(step - forward: paged attention, scheduling, sampling). Shares: of the profiled "
        "operators' self time (the profiler times operators in wall time, which a loaded "
        "machine inflates, so only shares are given)"
    )
    print(
        "| format / attention | engine step ms | linears | rest of forward | attention + engine "
        "| profiled: linear kernels | attention | other operators (calls) | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for f, step, (lin, att, other, n_other) in splits:
        r = rows[f]
        total = lin + att + other
        print(
            f"| {f} | {step:.1f} | {r['linears']:.1f} | {r['forward'] - r['linears']:.1f} | "
            f"{step - r['forward']:.1f} | {lin / total:.0%} | {att / total:.0%} | "
            f"{other / total:.0%} ({n_other:.0f}) | {load_average()} |"
        )


# Operators that are the linear layers' kernels (aten::mm also counts int8's small rotation
# products and fp32's tied head) and those that are decode attention (the kernel, or the
# torch path's gather and SDPA).
LINEAR_OPS = {
    "aten::mm",
    "aten::addmm",
    "quantized::linear_dynamic",
    "aten::_weight_int4pack_mm_for_cpu",
    "mkldnn::_linear_pointwise",
}
ATTENTION_OPS = {
    "ctxlab::paged_decode",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::index_select",
}


def split(ops, steps: int) -> tuple[float, float, float, float]:
    """(linear kernels, attention, other operators) in ms per step, and other calls per step."""
    lin = sum(e.self_cpu_time_total for e in ops if e.key in LINEAR_OPS)
    att = sum(e.self_cpu_time_total for e in ops if e.key in ATTENTION_OPS)
    rest = [e for e in ops if e.key not in LINEAR_OPS | ATTENTION_OPS]
    other = sum(e.self_cpu_time_total for e in rest)
    calls = sum(e.count for e in rest)
    return lin / steps / 1e3, att / steps / 1e3, other / steps / 1e3, calls / steps


if __name__ == "__main__":
    main()
