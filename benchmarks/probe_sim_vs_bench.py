"""Does a step profile measured from outside (`ctxlab probe`) let the simulator predict the
server it was measured on? Goal: p50 TTFT and p50 TPOT within 20 % of what `ctxlab bench
serve` observes replaying one Mooncake slice against the same server.

    .venv/bin/python benchmarks/probe_sim_vs_bench.py            # 24 requests of the slice

Steps (the engine settings and the trace scaling are serve_sim_vs_bench.py's: pages of 8
tokens, steps of at most 512 tokens and 16 requests, one torch thread):
1. `ctxlab serve` starts and is warmed up;
2. `ctxlab probe --sections prefix,profile` measures it from outside: the page size and
   the step profile (TTFT of cold prompts, ITL of concurrent decodes); the pool comes from
   the server's published `/metrics` (`cache_config_info`), which is what the probe's
   capacity section reports beside its own fill-until-evict figure (that section is left
   out here: filling a 16,384-token pool several times takes minutes on a shared CPU, and
   tests/probe checks it at a small pool);
3. `ctxlab bench serve --dataset trace` replays the slice (observed), and the profile is
   probed once more right after it: on a shared machine the speed drifts, and the two
   predictions bracket the replay (as serve_sim_vs_bench.py's two profiles do);
4. `ctxlab simulate` replays the same slice with the probed profile and page size and the
   published pool (predicted).
Prints predicted, observed and observed / predicted for TTFT and TPOT percentiles, and the
load average (the machine is shared: figures are noisy).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import serve_sim_vs_bench
from _serving import CLI, ENV, ROOT, bench, ctxlab_server, gguf_path, load_average
from serve_sim_vs_bench import CHUNK, MAX_RUNNING, MODEL, PAGE, POOL_TOKENS, derive_trace

# shared/data beside the checkout (main) or beside its parent folder (a worktree)
TRACES = [p / "shared" / "data" / "traces" / "conversation_trace.jsonl" for p in ROOT.parents[:2]]


def probe(url: str, out: Path, sections: str = "prefix,profile") -> dict:
    cmd = [*CLI, "probe", "--server", url, "--sections", sections,
           "--longest", "60", "--yes", "--json", "--out", str(out)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"probe failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout)


def published_pool(url: str) -> int:
    """num_gpu_blocks x block_size of the server's cache_config_info."""
    from ctxlab.probe.metrics import parse, published_capacity

    with urllib.request.urlopen(f"{url}/metrics") as r:
        fig = published_capacity(parse(r.read().decode()))
    if not isinstance(fig.value, int):
        raise RuntimeError(f"the server publishes no cache capacity: {fig.note}")
    return fig.value


def simulate(trace: Path, profile: Path, page: int, pool_tokens: int) -> dict:
    from ctxlab.arch import resolve_arch
    from ctxlab.sim.steptime import ArchCost

    arch = resolve_arch(gguf=Path(gguf_path()))
    pool_bytes = pool_tokens * ArchCost.build(arch, arch.weight_bytes).kv_bytes_per_token
    cmd = [*CLI, "simulate", str(trace), "--gguf", gguf_path(), "--profile", str(profile),
           "--hash-block", str(PAGE), "--page-size", str(page), "--chunk-tokens", str(CHUNK),
           "--max-running", str(MAX_RUNNING), "--pool-bytes", str(pool_bytes), "--json",
           "--out", str(trace.parent / "sim")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, check=True)
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--start", type=int, default=6000, help="First request of the window.")
    ap.add_argument("--time-scale", type=float, default=10.0, help="Stretch the timestamps.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", type=Path, default=None, help="A Mooncake trace .jsonl.")
    a = ap.parse_args()
    found = [a.trace] if a.trace else [p for p in TRACES if p.exists()]
    if found:
        serve_sim_vs_bench.TRACE = found[0]  # derive_trace reads it (synthetic when absent)
    work = Path(tempfile.mkdtemp(prefix="ctxlab-probesim-"))
    trace = work / "trace.jsonl"
    source = derive_trace(trace, a.start, a.requests, a.time_scale, a.seed)
    args = ["--model", MODEL, "--dataset", "trace", "--trace", str(trace),
            "--trace-hash-block", str(PAGE), "--ignore-eos", "--metric-percentiles", "50,95",
            "--percentile-metrics", "ttft,tpot,itl,e2el"]  # fmt: skip
    warm = ["--model", MODEL, "--num-prompts", "8", "--input-len", "300", "--output-len", "8",
            "--max-concurrency", "4", "--seed", "99"]  # fmt: skip
    server = ("--threads", "1", "--kv-pool-tokens", str(POOL_TOKENS), "--page-size", str(PAGE),
              "--max-num-batched-tokens", str(CHUNK),
              "--max-num-seqs", str(MAX_RUNNING))  # fmt: skip
    with ctxlab_server(*server) as url:
        bench(url, warm)
        load0 = load_average()
        doc = probe(url, work / "probe.json")
        pool = published_pool(url)
        block, obs = bench(url, args)
        load1 = load_average()
        after = probe(url, work / "probe-after.json", "profile")
    figs = {f["name"]: f for fs in doc["sections"].values() for f in fs}
    page = figs["cache granularity"]["value"]
    sims = [simulate(trace, Path(d["profile_file"]), page, pool) for d in (doc, after)]
    print(f"trace: {source}; scaled as serve_sim_vs_bench.py (pages of {PAGE} tokens)")
    print(f"probed: page {page} tokens ({figs['cache granularity']['how']}); pool {pool} "
          f"tokens from /metrics (configured {POOL_TOKENS}); {doc['sent']['requests']} probe "
          "requests")  # fmt: skip
    print(f"load average {load0} before the probe, {load1} after the replay")
    print("\n" + block + "\n")
    print("| figure | predicted, probe before | predicted, probe after | observed | "
          "observed / predicted |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for name, sk, ok in (("TTFT", "ttft", "ttft"), ("TPOT", "tpot", "tpot"), ("ITL", "itl", "itl"),
                         ("E2E latency", "e2e", "e2el")):  # fmt: skip
        for q in ("p50", "p95"):
            p = [s[f"{sk}_{q}"] * 1e3 for s in sims]
            o = obs[f"{'median' if q == 'p50' else q}_{ok}_ms"]
            goal = " (goal: within 20 %)" if q == "p50" and sk in ("ttft", "tpot") else ""
            print(f"| {name} {q} (ms){goal} | {p[0]:,.1f} | {p[1]:,.1f} | {o:,.1f} | "
                  f"{o / p[0]:.2f} to {o / p[1]:.2f} |")  # fmt: skip
    print(f"\nfiles in {work}")


if __name__ == "__main__":
    main()
