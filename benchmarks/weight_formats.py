"""Linear-layer kernels on this CPU, over the default model's real weights; what each format
stores, the rounding it adds, and how long a cold `ctxlab generate` takes.

    .venv/bin/python benchmarks/weight_formats.py                 # everything, 1 thread
    .venv/bin/python benchmarks/weight_formats.py --only kernels --ms 1,16,256 --reps 5
    .venv/bin/python benchmarks/weight_formats.py --only error,cold

kernels: one "sweep" is every linear layer of the model once (30 layers x q|k|v, o, gate|up,
down) plus the output head: what one forward reads. Each kernel holds its own copy of all
those weights (so nothing stays in cache between layers, as in a real step), and the kernels
run interleaved, sweep after sweep, so load from other processes hits them alike. Best and
median of `--reps`; the ratio is float32's time over the kernel's (above 1 = faster).
error: for each format, the rounding it adds to the weights the GGUF decodes to (RMS over
RMS of the weights), beside the GGUF's own rounding estimated from its blocks (step/sqrt 12
per value, the error of rounding to a grid of that step).
decode: batch-1 decode step of the engine after 512 and 4,096 prompt tokens, per weight
format and KV format (none = the pool in float32, int8, kivi4), interleaved: at long context
the KV read rivals the weights.
cold: wall time of `ctxlab generate "Hello" --max-tokens 8` in a fresh process, per format,
two interleaved rounds.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from ctxlab.model import gemv, load_model
from ctxlab.model.gguf_blocks import GROUP, quantize_groups
from ctxlab.model.qlinear import (
    BF16Linear,
    Int4Linear,
    Int8Linear,
    OneDNNLinear,
    native_bf16,
    onednn_available,
    row_int8,
)
from ctxlab.model.registry import DEFAULT_MODEL, REGISTRY, packaged_path
from ctxlab.model.weights import LINEARS, WEIGHT_FORMATS, gguf_codes, weight_bytes

Kernel = Callable[[torch.Tensor], torch.Tensor]


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def cpu_flags() -> str:
    text = Path("/proc/cpuinfo").read_text()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16")
    return " ".join(f for f in wanted if f in have) or "none of interest"


def model_weights(loaded) -> list[tuple[str, torch.Tensor]]:
    """(name, float weight) of every linear of one forward, the output head last."""
    out = []
    for i, layer in enumerate(loaded.model.layers):
        for name in LINEARS:
            owner, attr = name.split(".")
            out.append((f"layers.{i}.{name}", getattr(getattr(layer, owner), attr).weight))
    head = loaded.model.lm_head or loaded.model.embed_tokens
    out.append(("head", head.weight))
    return out


def _quantized_tensor(w: torch.Tensor):
    codes, scale = row_int8(w)
    zeros = torch.zeros(w.shape[0], dtype=torch.int64)
    return torch._make_per_channel_quantized_tensor(codes, scale.double(), zeros, 0)


def kernel_makers() -> dict[str, Callable[[torch.Tensor], Kernel]]:
    """Each: float weight [out, in] -> a function of x [M, in] (float32 in, float out)."""

    def fp32(w):
        return lambda x: F.linear(x, w)

    def onednn(w):
        previous = torch.backends.quantized.engine
        torch.backends.quantized.engine = "onednn"
        packed = torch.ops.quantized.linear_prepack(_quantized_tensor(w), None)
        torch.backends.quantized.engine = previous
        return lambda x: torch.ops.quantized.linear_dynamic(x, packed, False)

    def int8pack(w):
        codes, scale = row_int8(w)
        scale = scale.to(torch.bfloat16)
        return lambda x: torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), codes, scale)

    def int_mm(w):  # plain int8 GEMM with per-token input scales done in torch ops
        codes, scale = row_int8(w)
        t = codes.t()

        def run(x):
            sx = x.abs().amax(1, keepdim=True).div_(127).clamp_min_(1e-12)
            xq = torch.div(x, sx).round_().to(torch.int8)
            return torch._int_mm(xq, t).float().mul_(sx).mul_(scale)

        return run

    onednn_fp32 = {"fp32 oneDNN prepacked (ctxlab fp32-onednn)": lambda w: OneDNNLinear(w)}
    kernels = {
        "fp32 F.linear (MKL)": fp32,
        **(onednn_fp32 if onednn_available() else {}),
        "bf16 F.linear": lambda w: BF16Linear(w, kernel="aten"),
        "int8 fbgemm dynamic": lambda w: Int8Linear(w, kernel="fbgemm"),
        "int8 onednn dynamic": onednn,
        "int4 aten int4pack, bf16 (ctxlab int4)": lambda w: Int4Linear(quantize_groups(w, 4)),
        "int8 aten _weight_int8pack_mm, bf16": int8pack,
        "int8 torch._int_mm, per-token": int_mm,
    }
    if native_bf16():  # oneDNN refuses to prepack bf16 without bf16 dot products
        kernels["bf16 oneDNN prepacked"] = lambda w: OneDNNLinear(w, None, torch.bfloat16)
    if gemv.kernels() is not None:  # ctxlab's compiled kernels (a C compiler here)
        dot = "bf16 dot products" if gemv.bf16_dot_products() else "widened"
        kernels[f"bf16 compiled loop, {dot} (F.linear above 8 rows)"] = lambda w: BF16Linear(
            w, kernel="loop"
        )
        if gemv.amx():
            kernels["bf16 AMX tiles (ctxlab bf16 here)"] = lambda w: BF16Linear(w, kernel="amx")
        if gemv.amx_int8():
            kernels["int8 AMX tiles (ctxlab int8 here)"] = lambda w: Int8Linear(w, kernel="amx")
        kernels["fp32 compiled loop (F.linear above 8 rows)"] = lambda w: (
            lambda x: gemv.small_linear(x, w) if x.shape[0] <= gemv.MAX_ROWS else F.linear(x, w)
        )
    return kernels


def bench_kernels(weights, ms: list[int], reps: int, names: list[str] | None) -> None:
    makers = kernel_makers()
    chosen = [n for n in makers if names is None or any(s in n for s in names)]
    if "fp32 F.linear (MKL)" not in chosen:
        chosen.insert(0, "fp32 F.linear (MKL)")
    print(f"\n## Kernels: one sweep = {len(weights)} linears (all layers + head), 1 thread")
    print(f"load before building: {load()}")
    built: dict[str, list[Kernel]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in chosen:
            built[name] = [makers[name](w) for _, w in weights]
    header = " | ".join(f"M = {m}" for m in ms)
    print(f"| kernel | {header} |")
    print("|---|" + "---|" * len(ms))
    results: dict[tuple[str, int], list[float]] = {}
    loads = []
    for m in ms:
        xs = [torch.randn(m, w.shape[1]) for _, w in weights]
        for fns in built.values():  # warm-up
            for fn, x in zip(fns, xs, strict=True):
                fn(x)
        # the packed int4 and int8pack kernels take seconds per sweep at large M
        n = reps if m <= 16 else max(2, reps // 2)
        for _ in range(n):
            for name, fns in built.items():
                start = time.perf_counter()
                for fn, x in zip(fns, xs, strict=True):
                    fn(x)
                results.setdefault((name, m), []).append(time.perf_counter() - start)
        loads.append(load())
    for name in built:
        cells = []
        for m in ms:
            t = results[(name, m)]
            base = min(results[("fp32 F.linear (MKL)", m)])
            cells.append(
                f"{min(t) * 1e3:.1f} / {statistics.median(t) * 1e3:.1f} ms ({base / min(t):.2f}x)"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"best / median ms per sweep (x: fp32 best over kernel best); load after each M: {loads}")


def bench_error(loaded) -> None:
    """Added weight rounding per format and linear kind, beside the GGUF's own estimate."""
    print("\n## Rounding added to the GGUF's weights (RMS error / RMS weight)")
    codes = gguf_codes(loaded.source_path, loaded.config)
    kinds: dict[str, dict[str, list[float]]] = {}
    for name, w in model_weights(loaded):
        kind = name.split(".")[-1] if name != "head" else "head (token_embd)"
        key = name if name != "head" else "embed_tokens"
        w = w.detach().float()
        rms = float(w.pow(2).mean().sqrt())
        row = kinds.setdefault(kind, {})
        own = codes.get(key)
        if own is not None:
            step = own.scale.pow(2).mean().sqrt() / math.sqrt(12)
            row.setdefault(f"GGUF {own.source} own (est.)", []).append(float(step) / rms)
        c, s = row_int8(w)
        row.setdefault("int8 (per-row)", []).append(_rel(c.float() * s[:, None], w, rms))
        bf = w.to(torch.bfloat16).float()
        row.setdefault("bf16", []).append(_rel(bf, w, rms))
        four = own if own is not None and own.bits == 4 else quantize_groups(w, 4)
        stored = _bf16_scales(four)
        row.setdefault("int4 (codes + bf16 scales)", []).append(_rel(stored, w, rms))
        if own is not None and own.bits == 8:
            row.setdefault("int8 table (Q8_0 exact)", []).append(_rel(own.dequantize(), w, rms))
    columns = sorted({c for r in kinds.values() for c in r})
    print("| linear | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for kind, row in kinds.items():
        cells = [f"{statistics.mean(row[c]) * 100:.2f} %" if c in row else "-" for c in columns]
        print(f"| {kind} | " + " | ".join(cells) + " |")
    print("int4 on a Q4_0/Q4_1 source: the file's codes, only the scales rounded to bf16.")


def _rel(approx: torch.Tensor, exact: torch.Tensor, rms: float) -> float:
    return float((approx - exact).pow(2).mean().sqrt()) / rms


def _bf16_scales(codes) -> torch.Tensor:
    rows, cols = codes.codes.shape
    q = codes.codes.float().sub_(codes.code_zero).view(rows, cols // GROUP, GROUP)
    scale = codes.scale.to(torch.bfloat16).float()[..., None]
    offset = codes.offset.to(torch.bfloat16).float()[..., None]
    return (q * scale + offset).view(rows, cols)


def bench_memory(model: str) -> None:
    print("\n## Stored weights and load time per format")
    print("| format | weights stored | load_model s | load avg |")
    print("|---|---|---|---|")
    for fmt in WEIGHT_FORMATS:
        start = time.perf_counter()
        loaded = load_model(model, weights=fmt)
        took = time.perf_counter() - start
        print(f"| {fmt} | {weight_bytes(loaded.model) / 2**20:.1f} MiB | {took:.2f} | {load()} |")
        del loaded


def bench_cold(formats: list[str], reps: int = 2) -> None:
    print('\n## Cold start: `ctxlab generate "Hello" --max-tokens 8` in a fresh process')
    print("| format | wall s | user+sys CPU s | load avg |")
    print("|---|---|---|---|")
    exe = Path(sys.executable).with_name("ctxlab")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    for fmt in [f for _ in range(reps) for f in formats]:  # interleaved rounds
        before = os.times()
        start = time.perf_counter()
        subprocess.run(
            [str(exe), "generate", "Hello", "--max-tokens", "8", "--weights", fmt],
            env=env,
            check=True,
            capture_output=True,
        )
        wall = time.perf_counter() - start
        after = os.times()
        cpu = (after.children_user - before.children_user) + (
            after.children_system - before.children_system
        )
        print(f"| {fmt} | {wall:.2f} | {cpu:.2f} | {load()} |")


def bench_decode(model: str, weights: list[str], kv_formats: list[str], contexts: list[int]):
    from ctxlab.engine import LLM, SamplingParams

    print("\n## Batch-1 decode step, ms (CPU best / wall median), by weights and KV format")
    loaded = {w: load_model(model, weights=w) for w in weights}
    print("| context | " + " | ".join(f"{w} weights" for w in weights) + " | KV format | load |")
    print("|---|" + "---|" * len(weights) + "---|---|")
    g = torch.Generator().manual_seed(0)
    for ctx in contexts:
        prompt = torch.randint(1000, 48000, (ctx,), generator=g).tolist()
        engines, rids = {}, {}
        for w in weights:
            for kv in kv_formats:
                llm = LLM(
                    loaded[w],
                    kv_pool_tokens=ctx + 1024,
                    enable_prefix_caching=False,
                    kv_format=None if kv == "none" else kv,
                )
                eng = llm.engine
                params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
                rids[(w, kv)] = eng.add_request(prompt, params)
                while eng.seqs[rids[(w, kv)]].metrics.output_tokens == 0:
                    eng.step()
                engines[(w, kv)] = eng
        cpu: dict[tuple, list[float]] = {}
        wall: dict[tuple, list[float]] = {}
        for _ in range(3):
            for key, eng in engines.items():
                c, t = time.process_time(), time.perf_counter()
                for _ in range(32):
                    eng.step()
                cpu.setdefault(key, []).append((time.process_time() - c) / 32)
                wall.setdefault(key, []).append((time.perf_counter() - t) / 32)
        for kv in kv_formats:
            cells = [
                f"{min(cpu[(w, kv)]) * 1e3:.1f} / {statistics.median(wall[(w, kv)]) * 1e3:.1f}"
                for w in weights
            ]
            print(f"| {ctx} | " + " | ".join(cells) + f" | {kv} | {load()} |")
        del engines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--only", default="kernels,error,memory,decode,cold")
    parser.add_argument("--contexts", default="512,4096", help="decode: prompt lengths")
    parser.add_argument("--decode-weights", default="fp32,int8,int4")
    parser.add_argument("--kv-formats", default="none,int8,kivi4")
    parser.add_argument("--ms", default="1,16,256", help="token counts M per sweep")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--kernels", default=None, help="comma list of name parts to keep")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    only = set(args.only.split(","))
    print(f"torch {torch.__version__}; cpu flags: {cpu_flags()}; threads {args.threads}")
    if args.model == DEFAULT_MODEL:
        print(f"model file: {packaged_path(REGISTRY[DEFAULT_MODEL])}")
    loaded = load_model(args.model) if only & {"kernels", "error"} else None
    if "kernels" in only:
        ms = [int(m) for m in args.ms.split(",")]
        names = args.kernels.split(",") if args.kernels else None
        bench_kernels(model_weights(loaded), ms, args.reps, names)
    if "error" in only:
        bench_error(loaded)
    del loaded
    if "memory" in only:
        bench_memory(args.model)
    if "decode" in only:
        contexts = [int(c) for c in args.contexts.split(",")]
        kv_formats = args.kv_formats.split(",")
        bench_decode(args.model, args.decode_weights.split(","), kv_formats, contexts)
    if "cold" in only:
        bench_cold(list(WEIGHT_FORMATS))


if __name__ == "__main__":
    main()
