"""Prefill and decode in two processes against one colocated server, on the same two cores.

    .venv/bin/python benchmarks/disagg_vs_colocated.py            # 3 rounds, + simulator
    .venv/bin/python benchmarks/disagg_vs_colocated.py --quick    # 1 round, no simulator

Servers (same model, pool, page and step budget; measured one after the other):
- colocated: `ctxlab serve --threads 2` (both cores, one process);
- disaggregated: `ctxlab serve --disaggregated --threads 1 --prefill-cpu 0 --decode-cpu 1`
  (each process one torch thread pinned to its own core; KV over a Unix socket).
The workload (one round, sent through `ctxlab.bench.client`, the load generator's client):
`--streams` decode streams (short prompts, `--stream-out` tokens, EOS ignored) start at
once; while they decode, `--long` long prompts (`--long-len` tokens, 8 output tokens) arrive
`--gap` s apart. Every prompt is different text (no prefix-cache hits). Printed:
- resident memory (VmRSS, VmHWM) of every process, the model's weight bytes (each process
  holds a copy), and the pools;
- KV bytes and seconds moved per request (the decode process's transfer log);
- TTFT and TPOT at p50 and p99 over all requests, with n and a 95 % bootstrap interval, and
  the ITL p99 of the decode streams while the long prompts are prefilled (the interference);
- unless --no-sim: `ctxlab simulate --disaggregated` on the same requests and arrival times
  from a measured 1-thread step profile (`ctxlab profile --quick --threads 1`) and the
  measured transfer bandwidth, beside the measurement (goal: TTFT p50 within 25 %).
The machine's two cores are shared with other work: figures are noisy; the load average
before and after each run is printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _serving import CLI, ENV, ROOT, gguf_path, load_average

PAGE = 16
POOL_TOKENS = 16384
MIB = 2**20


@dataclass
class Planned:
    index: int
    kind: str  # "stream" or "long"
    at: float  # seconds from the round's start
    prompt: str
    prompt_len: int
    output_len: int


def plan_round(args: argparse.Namespace, round_no: int) -> list[Planned]:
    import numpy as np

    from ctxlab.bench.words import WORDS, text_of

    rng = np.random.default_rng([args.seed, round_no])
    out: list[Planned] = []

    def words(n: int) -> str:
        return text_of(rng.integers(0, len(WORDS), size=n).tolist())

    for _ in range(args.streams):
        out.append(Planned(len(out), "stream", 0.0, words(args.stream_len), args.stream_len,
                           args.stream_out))  # fmt: skip
    for j in range(args.long):
        at = args.lead + j * args.gap
        out.append(Planned(len(out), "long", at, words(args.long_len), args.long_len, 8))
    return out


async def run_round(url: str, plan: list[Planned]) -> list:
    import httpx

    from ctxlab.bench.client import Endpoint, send
    from ctxlab.bench.metrics import RequestResult

    ep = Endpoint(url, "/v1/completions", "smollm2-135m", ignore_eos=True)
    t0 = time.perf_counter()
    results = [RequestResult(p.index, p.prompt_len) for p in plan]

    async def one(p: Planned, res: RequestResult) -> None:
        await asyncio.sleep(max(0.0, p.at - (time.perf_counter() - t0)))
        await send(client, ep, p.prompt, p.output_len, res, t0, timeout=600)

    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(one(p, r) for p, r in zip(plan, results, strict=True)))
    return results


def start_server(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    cmd = [*CLI, "serve", "--port", "0", "--kv-pool-tokens", str(POOL_TOKENS),
           "--page-size", str(PAGE), *args]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, cwd=ROOT)  # fmt: skip
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("ready "):
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    url = line.split()[1]
    import httpx

    end = time.monotonic() + 300
    while time.monotonic() < end:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError("the server did not become healthy")


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def weight_bytes() -> int:
    from ctxlab.model import load_model

    model = load_model("smollm2-135m").model
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(name: str, server_args: list[str], args: argparse.Namespace, log: Path | None):
    env = dict(ENV)
    if log is not None:
        env["CTXLAB_DISAGG_LOG"] = str(log)
    proc, url = start_server(server_args, env)
    try:
        warm = plan_round(argparse.Namespace(**{**vars(args), "long": 1, "streams": 1}), 999)
        asyncio.run(run_round(url, warm))  # warm-up (first-call costs), not counted
        if log is not None:
            log.write_text("")
        load0 = load_average()
        rounds = [asyncio.run(run_round(url, plan_round(args, r))) for r in range(args.rounds)]
        load1 = load_average()
        pids = [proc.pid, *children(proc.pid)]
        mem = {pid: memory(pid) for pid in pids}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"name": name, "rounds": rounds, "mem": mem, "load": (load0, load1)}


def summarize(run: dict, args: argparse.Namespace) -> dict:
    from ctxlab.stats import percentile, percentile_interval

    ttft, tpot, itl_busy, failed = [], [], [], 0
    for r_no, results in enumerate(run["rounds"]):
        plan = plan_round(args, r_no)
        # while a long prompt waits for its first token (prefilled, and moved if split)
        busy = [(r.start, r.start + r.ttft) for p, r in zip(plan, results, strict=True)
                if p.kind == "long" and r.success]  # fmt: skip
        for p, res in zip(plan, results, strict=True):
            if not res.success:
                failed += 1
                continue
            ttft.append(res.ttft)
            if res.output_len > 1:
                tpot.append(res.tpot)
            if p.kind == "stream":
                t = res.start + res.ttft
                for gap in res.itl:
                    t += gap
                    if any(lo <= t <= hi for lo, hi in busy):
                        itl_busy.append(gap)

    def block(values: list[float]) -> dict:
        return {
            "n": len(values),
            "p50": percentile(values, 50),
            "p50_ci": percentile_interval(values, 50).to_json(),
            "p99": percentile(values, 99),
            "p99_ci": percentile_interval(values, 99).to_json(),
        }

    return {"ttft": block(ttft), "tpot": block(tpot), "itl_busy": block(itl_busy),
            "failed": failed}  # fmt: skip


def trace_file(args: argparse.Namespace, out: Path) -> Path:
    """The measured workload as a Mooncake trace (a page per hash id, all ids distinct)."""
    rows, next_id, t_round = [], 0, 0.0
    for r_no in range(args.rounds):
        plan = plan_round(args, r_no)
        for p in plan:
            n_ids = -(-p.prompt_len // PAGE)
            ids = list(range(next_id, next_id + n_ids))
            next_id += n_ids
            rows.append({"timestamp": int((t_round + p.at) * 1000), "input_length": p.prompt_len,
                         "output_length": p.output_len, "hash_ids": ids})  # fmt: skip
        t_round += args.round_s
    path = out / "workload.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def simulate(trace: Path, profile: Path, bandwidth: float, disaggregated: bool) -> dict:
    from ctxlab.arch import resolve_arch
    from ctxlab.sim.steptime import ArchCost

    arch = resolve_arch(gguf=Path(gguf_path()))
    pool = POOL_TOKENS * ArchCost.build(arch, arch.weight_bytes).kv_bytes_per_token
    cmd = [*CLI, "simulate", str(trace), "--gguf", gguf_path(), "--profile", str(profile),
           "--hash-block", str(PAGE), "--page-size", str(PAGE), "--chunk-tokens", "4096",
           "--pool-bytes", str(pool), "--json", "--out", str(trace.parent / "sim")]  # fmt: skip
    if disaggregated:
        cmd += ["--disaggregated", "--kv-transfer-bandwidth", str(bandwidth)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, check=True)
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=4, help="Decode streams per round.")
    ap.add_argument("--stream-len", type=int, default=48, help="Their prompt tokens.")
    ap.add_argument("--stream-out", type=int, default=64, help="Their output tokens.")
    ap.add_argument("--long", type=int, default=3, help="Long prompts per round.")
    ap.add_argument("--long-len", type=int, default=1024, help="Their prompt tokens.")
    ap.add_argument("--lead", type=float, default=0.5, help="Seconds before the first long.")
    ap.add_argument("--gap", type=float, default=1.0, help="Seconds between long prompts.")
    ap.add_argument("--round-s", type=float, default=30.0, help="Trace spacing of rounds.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="1 round, no simulator.")
    ap.add_argument("--no-sim", action="store_true")
    ap.add_argument("--profile", type=Path, help="Reuse a 1-thread step profile.")
    ap.add_argument("--json", type=Path, help="Also write every figure here.")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.no_sim = 1, True
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("error: this benchmark needs two cores.")
    out = Path(tempfile.mkdtemp(prefix="ctxlab-disagg-"))
    log = out / "transfers.jsonl"
    common = ["--max-num-batched-tokens", "4096"]
    colo = measure("colocated", ["--threads", "2", *common], args, None)
    profile = args.profile or out / "profile.json"
    if not args.no_sim and args.profile is None:
        # on the prefill process's core, just before its run: the machine's speed drifts
        # when its cores are shared, and the prefill side's steps are most of TTFT
        subprocess.run(["taskset", "-c", str(cpus[0]), *CLI, "profile", "--quick", "--threads",
                        "1", "--block-size", str(PAGE), "--out", str(profile), "--json"],
                       env=ENV, cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    dis = measure("disaggregated", ["--disaggregated", "--threads", "1",
                  "--prefill-cpu", str(cpus[0]), "--decode-cpu", str(cpus[1]), *common],
                  args, log)  # fmt: skip
    transfers = [json.loads(line) for line in log.read_text().splitlines() if line]
    wbytes = weight_bytes()
    res = {"colocated": summarize(colo, args), "disaggregated": summarize(dis, args)}
    report(colo, dis, res, transfers, wbytes, args)
    record = {"figures": res, "transfers": transfers, "weight_bytes": wbytes,
              "memory": {"colocated": colo["mem"], "disaggregated": dis["mem"]},
              "load": {"colocated": colo["load"], "disaggregated": dis["load"]}}  # fmt: skip
    if not args.no_sim:
        long_tr = [t for t in transfers if t["pages"] >= args.long_len // PAGE - 1]
        bw = sum(t["bytes"] for t in long_tr) / sum(t["transfer_s"] for t in long_tr)
        trace = trace_file(args, out)
        sim = simulate(trace, profile, bw, True)
        meas = res["disaggregated"]
        print(f"\nsimulator (--disaggregated, profile {profile.name}, transfer {bw / 1e9:.2f} "
              "GB/s measured) vs measured:")  # fmt: skip
        pairs = [(f"{k}_{q}", meas[k][q]) for k in ("ttft", "tpot") for q in ("p50", "p99")]
        for key, m in pairs:
            err = sim[key] / m - 1 if m else float("nan")
            print(f"  {key:9s} predicted {sim[key]:.3f} s  measured {m:.3f} s  ({err:+.0%})")
        record["sim"] = {k: v for k, v in sim.items() if isinstance(v, int | float)}
        record["sim_bandwidth"] = bw
    print(f"\nraw figures: {out}")
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))


def report(colo, dis, res, transfers, wbytes, args) -> None:
    print(f"workload: {args.rounds} round(s) of {args.streams} decode streams ({args.stream_len}"
          f" prompt, {args.stream_out} output tokens) and {args.long} prompts of "
          f"{args.long_len} tokens {args.gap} s apart")  # fmt: skip
    print(f"load average before/after: colocated {colo['load']}, disaggregated {dis['load']}"
          " (2 cores shared with other work: timings are noisy)")  # fmt: skip
    print(f"\nmodel weights: {wbytes / MIB:.0f} MiB per process (the disaggregated pair holds "
          f"two copies: {wbytes / MIB:.0f} MiB duplicated)")  # fmt: skip
    for run in (colo, dis):
        total = sum(m["VmRSS"] for m in run["mem"].values())
        peak = sum(m["VmHWM"] for m in run["mem"].values())
        each = ", ".join(f"{m['VmRSS'] / MIB:.0f}" for m in run["mem"].values())
        print(f"  {run['name']:14s} resident {total / MIB:6.0f} MiB (processes: {each}); "
              f"peak {peak / MIB:.0f} MiB")  # fmt: skip
    if transfers:
        from ctxlab.stats import percentile

        for label, rows in (("long prompts", [t for t in transfers if t["pages"] > 8]),
                            ("all", transfers)):  # fmt: skip
            if not rows:
                continue
            b = [t["bytes"] for t in rows]
            s = [t["transfer_s"] for t in rows]
            print(f"  KV moved per request ({label}, n={len(rows)}): "
                  f"{percentile(b, 50) / MIB:.1f} MiB p50 in {percentile(s, 50) * 1e3:.1f} ms p50 "
                  f"({percentile(s, 99) * 1e3:.1f} ms p99); "
                  f"{sum(b) / sum(s) / 1e9:.2f} GB/s")  # fmt: skip
    print(f"\n{'':14s} {'TTFT p50':>18s} {'TTFT p99':>10s} {'TPOT p50':>18s} {'TPOT p99':>10s}"
          f" {'ITL p99 busy':>14s}")  # fmt: skip
    for name, r in res.items():
        t, p, i = r["ttft"], r["tpot"], r["itl_busy"]
        ci = t["p50_ci"]
        print(f"{name:14s} {t['p50']:7.3f} [{ci['low']:.2f},{ci['high']:.2f}] {t['p99']:10.3f} "
              f"{p['p50']:7.4f} [{p['p50_ci']['low']:.3f},{p['p50_ci']['high']:.3f}]"
              f" {p['p99']:10.4f} {i['p99']:14.4f}")  # fmt: skip
        print(f"{'':14s} n: TTFT {t['n']}, TPOT {p['n']}, ITL {i['n']}; failed {r['failed']}")
    a, b = res["colocated"]["itl_busy"]["p99"], res["disaggregated"]["itl_busy"]["p99"]
    print(f"\nITL p99 while long prompts prefill: colocated / disaggregated = {a / b:.1f}x")


if __name__ == "__main__":
    main()
