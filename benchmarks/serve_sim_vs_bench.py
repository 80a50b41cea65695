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
2. step profiles: `ctxlab profile --quick --threads 1 --block-size 8`, measured just before
   and just after the replay (unless --profile): the machine's speed drifts when its cores are
   shared, and the two predictions bracket it;
3. observed: `ctxlab serve --threads 1 --page-size 8`, warmed up, then `ctxlab bench serve
   --dataset trace`;
4. predicted: `ctxlab simulate TRACE --profile ... --pool-bytes (the server's pool)`, once
   per profile.
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


def measure_profile(out: Path) -> Path:
    subprocess.run(
        [*CLI, "profile", "--quick", "--threads", "1", "--block-size", str(PAGE),
         "--out", str(out), "--json"],
        env=ENV, cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    return out


def replay(trace: Path) -> tuple[str, dict, dict, dict, str, str]:
    """Serve, warm up, replay the trace; (block, result, metrics before, after, load x2)."""
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
    return block, obs, m0, m1, before, after


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
    # Two profiles bracket the replay in time (unless one is given): on a shared machine the
    # speed drifts, and the spread of the two predictions shows by how much.
    profiles = [a.profile] if a.profile else [measure_profile(work / "profile-before.json")]
    block, obs, m0, m1, load0, load1 = replay(trace)
    if not a.profile:
        profiles.append(measure_profile(work / "profile-after.json"))
    sims = [simulate(trace, p) for p in profiles]
    print(
        f"trace: {source}; inputs / {SCALE_IN} (a hash id is one {PAGE}-token page), outputs "
        f"/ {SCALE_OUT} (at most {MAX_OUT}), timestamps x {a.time_scale}"
    )
    print(f"load average {load0} before the replay, {load1} after")
    print("\n" + block + "\n")

    def engine_mean(name: str) -> float:  # the server's own clock, from its histograms
        d = {k: m1.get(f"ctxlab:{name}_{k}", 0.0) - m0.get(f"ctxlab:{name}_{k}", 0.0)
             for k in ("sum", "count")}  # fmt: skip
        return d["sum"] / d["count"] * 1e3 if d["count"] else math.nan

    rows: list[tuple[str, list[float], float]] = []
    names = (("TTFT", "ttft", "ttft"), ("TPOT", "tpot", "tpot"), ("ITL", "itl", "itl"),
             ("E2E latency", "e2e", "e2el"))  # fmt: skip
    for name, sim_key, obs_key in names:
        for q in ("p50", "p95", "p99", "mean"):
            okey = f"{'median' if q == 'p50' else q}_{obs_key}_ms"
            rows.append((f"{name} {q} (ms)", [x[f"{sim_key}_{q}"] * 1e3 for x in sims], obs[okey]))
    rows += [
        ("TTFT mean, server's engine clock (ms)", [x["ttft_mean"] * 1e3 for x in sims],
         engine_mean("time_to_first_token_seconds")),
        ("ITL mean, server's engine clock (ms)", [x["itl_mean"] * 1e3 for x in sims],
         engine_mean("inter_token_latency_seconds")),
        ("output tokens / s", [x["throughput_tokens_per_s"] for x in sims],
         obs["output_throughput"]),
        ("reused prompt tokens", [x["reused_tokens"] for x in sims], obs["cached_input_tokens"]),
        ("preemptions", [x["preemptions"] for x in sims],
         m1["ctxlab:num_preemptions_total"] - m0["ctxlab:num_preemptions_total"]),
    ]  # fmt: skip
    heads = ["predicted, profile before", "predicted, profile after"][: len(sims)]
    if a.profile:
        heads = [f"predicted ({a.profile.name})"]
    print("| figure | " + " | ".join(heads) + " | observed | observed / predicted |")
    print("|---|" + "---:|" * (len(heads) + 2))
    for label, preds, o in rows:
        ratios = [f"{o / p:.2f}" for p in preds if p]
        cells = " | ".join(f"{p:,.1f}" for p in preds)
        print(f"| {label} | {cells} | {o:,.1f} | {' to '.join(ratios) or '-'} |")
    print(f"\nfiles in {work}")


if __name__ == "__main__":
    main()
