"""What `ctxlab simulate` predicts for a trace beside what `ctxlab bench serve` observes when
the same trace is replayed against `ctxlab serve` on this machine.

    .venv/bin/python benchmarks/serve_sim_vs_bench.py                  # 40 requests
    .venv/bin/python benchmarks/serve_sim_vs_bench.py --profile FILE    # reuse a profile

Steps, all with the same engine settings (pages of 8 tokens, steps of at most 512 tokens and
16 running requests, so no step is larger than the quick profile measured, the pool below)
and one torch thread:
1. the trace: a window of the Mooncake conversation trace (shared/data; a generated
   synthetic trace when it is absent) scaled to this CPU: every 512-token hash block becomes
   8 tokens (one page, so the trace's reuse maps page for page), output lengths are divided
   by 16 (at most 48), and the timestamps are stretched by --time-scale. It is written as a
   Mooncake file that both tools read with --hash-block 8 / --trace-hash-block 8;
2. the step profile: `ctxlab profile --quick --threads 1 --block-size 8` (unless --profile);
3. observed: `ctxlab serve --threads 1 --page-size 8`, warmed up, then `ctxlab bench serve
   --dataset trace`;
4. predicted: `ctxlab simulate TRACE --profile ... --pool-bytes (the server's pool)`.
Prints one table (percentiles of TTFT, TPOT, ITL, E2E, throughput, reused prompt tokens,
preemptions) with the load average before and after the replay.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _serving import CLI, ENV, ROOT, bench, ctxlab_server, gguf_path, load_average

TRACE = ROOT.parent / "shared" / "data" / "traces" / "conversation_trace.jsonl"
PAGE = 8  # tokens per page, and per hash id once scaled
SCALE_IN = 512 // PAGE  # 512-token hash blocks -> one page
SCALE_OUT = 16
MAX_OUT = 48
POOL_TOKENS = 16384
CHUNK = 512  # the quick profile times prefill chunks up to 512 tokens
MAX_RUNNING = 16
MODEL = "smollm2-135m"


def derive_trace(out: Path, start: int, n: int, time_scale: float, seed: int) -> str:
    """Write the scaled window; returns where it came from."""
    if TRACE.exists():
        rows = [json.loads(line) for line in TRACE.open()][start : start + n]
        source = f"{TRACE.name} requests {start}..{start + n - 1}"
    else:  # the synthetic generator in Mooncake form (512-token hash blocks)
        from ctxlab.sim.synthetic import generate_from_spec

        spec = (f"n={n},rate=4,input=lognormal:8000:0.6,output=uniform:100:600,groups=4,"
                f"prefix=4096,turns=2,seed={seed}")  # fmt: skip
        tr = generate_from_spec(spec)
        rows = [
            {"timestamp": r.arrival * 1000, "input_length": r.input_len,
             "output_length": r.output_len, "hash_ids": list(r.hash_ids)}
            for r in tr.requests
        ]  # fmt: skip
        source = f"synthetic ({len(rows)} requests; shared/data is absent)"
    t0 = rows[0]["timestamp"]
    with out.open("w") as f:
        for r in rows:
            scaled = {
                "timestamp": (r["timestamp"] - t0) * time_scale,
                "input_length": math.ceil(r["input_length"] / SCALE_IN),
                "output_length": min(MAX_OUT, max(1, math.ceil(r["output_length"] / SCALE_OUT))),
                "hash_ids": r["hash_ids"],
            }
            f.write(json.dumps(scaled) + "\n")
    return source


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics") as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("ctxlab:") and "{" in line:
            name = line.split("{")[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def simulate(trace: Path, profile: Path) -> dict:
    from ctxlab.arch import resolve_arch
    from ctxlab.sim.steptime import ArchCost

    arch = resolve_arch(gguf=Path(gguf_path()))
    pool_bytes = POOL_TOKENS * ArchCost.build(arch, arch.weight_bytes).kv_bytes_per_token
    cmd = [*CLI, "simulate", str(trace), "--gguf", gguf_path(), "--profile", str(profile),
           "--hash-block", str(PAGE), "--page-size", str(PAGE), "--chunk-tokens", str(CHUNK),
           "--max-running", str(MAX_RUNNING), "--pool-bytes", str(pool_bytes), "--json",
           "--out", str(trace.parent / "sim")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, check=True)
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--start", type=int, default=6000, help="First request of the window.")
    ap.add_argument("--time-scale", type=float, default=10.0, help="Stretch the timestamps.")
    ap.add_argument("--profile", type=Path, default=None, help="A step profile to reuse.")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ctxlab-simbench-"))
    trace = work / "trace.jsonl"
    source = derive_trace(trace, a.start, a.requests, a.time_scale, a.seed)
    profile = a.profile
    if profile is None:
        profile = work / "profile.json"
        subprocess.run(
            [*CLI, "profile", "--quick", "--threads", "1", "--block-size", str(PAGE),
             "--out", str(profile), "--json"],
            env=ENV, cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
    args = ["--model", MODEL, "--dataset", "trace", "--trace", str(trace),
            "--trace-hash-block", str(PAGE), "--ignore-eos", "--metric-percentiles", "50,95,99",
            "--percentile-metrics", "ttft,tpot,itl,e2el"]  # fmt: skip
    warm = ["--model", MODEL, "--num-prompts", "8", "--input-len", "300", "--output-len", "8",
            "--max-concurrency", "4", "--seed", "99"]  # fmt: skip
    server = ("--threads", "1", "--kv-pool-tokens", str(POOL_TOKENS), "--page-size", str(PAGE),
              "--max-num-batched-tokens", str(CHUNK),
              "--max-num-seqs", str(MAX_RUNNING))  # fmt: skip
    with ctxlab_server(*server) as url:
        bench(url, warm)
        m0 = scrape(url)
        before = load_average()
        block, obs = bench(url, args)
        after = load_average()
        m1 = scrape(url)
    sim = simulate(trace, profile)
    preempt = m1["ctxlab:num_preemptions_total"] - m0["ctxlab:num_preemptions_total"]
    print(
        f"trace: {source}; inputs / {SCALE_IN} (a hash id is one {PAGE}-token page), outputs "
        f"/ {SCALE_OUT} (at most {MAX_OUT}), timestamps x {a.time_scale}"
    )
    print(f"profile: {profile}; load average {before} before the replay, {after} after")
    print("\n" + block + "\n")
    rows = []
    names = (("TTFT", "ttft", "ttft"), ("TPOT", "tpot", "tpot"), ("ITL", "itl", "itl"),
             ("E2E latency", "e2e", "e2el"))  # fmt: skip
    for name, sim_key, obs_key in names:
        for q in ("p50", "p95", "p99", "mean"):
            okey = f"{'median' if q == 'p50' else q}_{obs_key}_ms"
            rows.append((f"{name} {q} (ms)", sim[f"{sim_key}_{q}"] * 1e3, obs[okey]))
    rows.append(("output tokens / s", sim["throughput_tokens_per_s"], obs["output_throughput"]))
    rows.append(("requests / s", sim["throughput_requests_per_s"], obs["request_throughput"]))
    rows.append(("reused prompt tokens", sim["reused_tokens"], obs["cached_input_tokens"]))
    rows.append(("preemptions", sim["preemptions"], preempt))
    print("| figure | simulate (predicted) | bench serve (observed) | predicted / observed |")
    print("|---|---:|---:|---:|")
    for label, p, o in rows:
        ratio = f"{p / o:.2f}" if o else "-"
        print(f"| {label} | {p:,.1f} | {o:,.1f} | {ratio} |")
    print(f"\nfiles in {work}")


if __name__ == "__main__":
    main()
