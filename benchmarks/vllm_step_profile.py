"""Where vLLM's batch-1 decode step goes, on decode_profile.py's shapes: SmolLM2-135M, one
request, a 512-token prompt, one thread. The other half of issue 38's comparison: ctxlab's
step split is `decode_profile.py --formats fp32,bf16 --context 512`; this is vLLM's.

    make vllm && ctxlab export-hf smollm2-135m
    .venv/bin/python benchmarks/vllm_step_profile.py                    # fp32 and bf16, compiled
    .venv/bin/python benchmarks/vllm_step_profile.py --dtypes float32 --eager

Per dtype, one vLLM server (vLLM's CPU build, `make vllm`; compiled unless `--eager`):
1. unprofiled: `--reps` streamed requests of `--steps` output tokens (`ignore_eos`), each a
   fresh random 512-token prompt; the decode step is the mean gap between streamed tokens
   after the first (vLLM's TPOT at batch 1), the best of the reps;
2. profiled: one more such request between `POST /start_profile` and `/stop_profile`
   (vLLM's torch profiler, CPU activity, `VLLM_CUSTOM_SCOPES_FOR_PROFILING=1` so each engine
   step's model-runner phases are named), and from the trace, per decode step (the forward
   spans after the prefill's): the step (from one forward's start to the next's), the
   model's forward, and inside the forward the linear kernels (oneDNN's `_C::onednn_mm` on
   this CPU, sgl's packed linear, aten's mm), the attention kernels
   (`_C::cpu_attention_with_kv_cache` and the cache write), the other operators (the
   compiled graph's fused kernels and the rest), and the time no operator covered (Python,
   the compiled wrapper's glue).

The profiler slows what it records; the unprofiled step is beside it, and shares are of the
profiled step. Standard library only (the trace is JSON).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _serving import load_average, post, vllm_server

MODEL = "smollm2-135m"
VOCAB = 49152  # SmolLM2's vocabulary
# Operator names (the trace's) that are the linear layers' kernels and decode attention.
LINEAR = ("onednn_mm", "weight_packed_linear", "aten::mm", "aten::addmm", "aten::linear")
ATTENTION = ("cpu_attention_with_kv_cache", "cpu_attn_reshape_and_cache")


def decode_gap_ms(url: str, prompt: list[int], steps: int) -> float:
    """Stream one completion; the mean gap between tokens after the first, in ms."""
    body = {
        "model": MODEL, "prompt": prompt, "max_tokens": steps, "ignore_eos": True,
        "temperature": 0.0, "stream": True,
    }  # fmt: skip
    req = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    stamps = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if line.startswith(b"data: {"):
                stamps.append(time.perf_counter())
    if len(stamps) < 3:
        raise RuntimeError(f"vLLM streamed {len(stamps)} chunks for {steps} tokens")
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3


def _covered(spans: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def split_trace(events: list[dict]) -> dict[str, float]:
    """Per decode step (ms): step, forward, linear kernels, attention, other operators, and the
    forward's time under no operator; from a torch profiler trace of one batch-1 request."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    forwards = sorted(
        (e for e in spans if e["name"] == "gpu_model_runner: forward"), key=lambda e: e["ts"]
    )
    if len(forwards) < 3:
        raise RuntimeError(f"the trace holds {len(forwards)} forward steps (is the scope on?)")
    decode = forwards[1:-1]  # the first is the prefill; the last has no next step to end it
    tid = decode[0]["tid"]
    ops = sorted(
        (e for e in spans if e.get("cat") == "cpu_op" and e["tid"] == tid), key=lambda e: e["ts"]
    )
    starts = [e["ts"] for e in ops]
    out = {"steps": float(len(decode))}
    totals = dict.fromkeys(("step", "forward", "linear", "attention", "other", "uncovered"), 0.0)
    for f, nxt in zip(decode, forwards[2:], strict=True):
        lo, hi = f["ts"], f["ts"] + f["dur"]
        window = ops[bisect.bisect_left(starts, lo) : bisect.bisect_right(starts, hi)]
        inside = [e for e in window if e["ts"] + e["dur"] <= hi]
        groups = {"linear": [], "attention": [], "other": []}
        for e in inside:
            kind = (
                "linear"
                if any(k in e["name"] for k in LINEAR)
                else "attention"
                if any(k in e["name"] for k in ATTENTION)
                else "other"
            )
            groups[kind].append((e["ts"], e["ts"] + e["dur"]))
        lin, att = _covered(groups["linear"]), _covered(groups["attention"])
        every = _covered(groups["linear"] + groups["attention"] + groups["other"])
        totals["step"] += nxt["ts"] - lo
        totals["forward"] += f["dur"]
        totals["linear"] += lin
        totals["attention"] += att
        totals["other"] += every - lin - att
        totals["uncovered"] += f["dur"] - every
    out.update({k: v / len(decode) / 1e3 for k, v in totals.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--context", type=int, default=512, help="prompt tokens")
    ap.add_argument("--steps", type=int, default=64, help="output tokens per request")
    ap.add_argument("--reps", type=int, default=3, help="unprofiled requests (best kept)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eager", action="store_true", help="vLLM --enforce-eager")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ctxlab.hf.export import export_folder

    folder = str(export_folder(MODEL))
    rng = random.Random(0)

    def prompt() -> list[int]:
        return [rng.randrange(100, VOCAB) for _ in range(a.context)]

    rows = []
    for dtype in a.dtypes.split(","):
        with tempfile.TemporaryDirectory(prefix="vllm-prof-") as prof:
            config = {
                "profiler": "torch",
                "torch_profiler_dir": prof,
                "torch_profiler_with_stack": False,
            }
            extra = ("--profiler-config", json.dumps(config), "--max-num-seqs", "1")
            env = {"VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"}
            with vllm_server(folder, MODEL, dtype, a.threads, a.eager, extra, env) as url:
                decode_gap_ms(url, prompt(), a.steps)  # warm-up: compile the shapes
                before = load_average()
                plain = min(decode_gap_ms(url, prompt(), a.steps) for _ in range(a.reps))
                post(f"{url}/start_profile", "start its profiler")
                profiled = decode_gap_ms(url, prompt(), a.steps)
                post(f"{url}/stop_profile", "stop its profiler")
                after = load_average()
                deadline = time.monotonic() + 300
                traces: list[Path] = []
                while time.monotonic() < deadline:
                    traces = [p for p in Path(prof).rglob("*.pt.trace.json*")]
                    if traces and all(p.stat().st_size > 0 for p in traces):
                        break
                    time.sleep(1)
                time.sleep(2)  # the writer may still be flushing
            best = None
            for path in traces:
                opener = gzip.open if path.suffix == ".gz" else open
                with opener(path, "rt") as f:
                    events = json.load(f).get("traceEvents", [])
                try:
                    best = split_trace(events)
                    break
                except RuntimeError:
                    continue
            if best is None:
                raise SystemExit(f"no trace with decode steps among {[p.name for p in traces]}")
        rows.append((dtype, plain, profiled, best, f"{before} / {after}"))
        print(f"{dtype}: unprofiled step {plain:.1f} ms, profiled {profiled:.1f} ms, {best}")
    mode = "eager" if a.eager else "compiled"
    print(
        f"\nvLLM ({mode}), SmolLM2-135M, batch 1, {a.context}-token prompt, {a.threads} thread(s):"
        " ms per decode step (shares of the profiled step)\n"
    )
    print(
        "| dtype | unprofiled step | profiled step | forward | linear kernels | attention | "
        "other operators | forward, no operator | outside the forward | decode steps | load |"
    )
    print("|---|" + "---:|" * 9 + "---|")
    for dtype, plain, prof_gap, s, load in rows:
        step = s["step"]

        def cell(v: float, step: float = step) -> str:
            return f"{v:.1f} ({v / step:.0%})"

        print(
            f"| {dtype} | {plain:.1f} | {step:.1f} (stream {prof_gap:.1f}) | {cell(s['forward'])} "
            f"| {cell(s['linear'])} | {cell(s['attention'])} | {cell(s['other'])} | "
            f"{cell(s['uncovered'])} | {cell(step - s['forward'])} | {s['steps']:.0f} | {load} |"
        )


if __name__ == "__main__":
    main()
