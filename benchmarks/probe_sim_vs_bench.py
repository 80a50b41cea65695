"""Does a step profile measured from outside (`ctxlab probe`) let the simulator predict the
server it was measured on? Goal: p50 TTFT and p50 TPOT within 20 % of what `ctxlab bench
serve` observes replaying one Mooncake slice against the same server.

    .venv/bin/python benchmarks/probe_sim_vs_bench.py                # 48 requests, x2, 3 rounds
    .venv/bin/python benchmarks/probe_sim_vs_bench.py --requests 24 --time-scale 10 --rounds 1

Steps (the engine settings and the trace scaling are serve_sim_vs_bench.py's: pages of 8
tokens, steps of at most 512 tokens and 16 requests, one torch thread):
1. `ctxlab serve --step-log` starts and is warmed up;
2. `ctxlab probe --sections prefix,profile` measures it from outside: the page size and
   the step profile (TTFT of cold prompts, ITL of concurrent decodes, mixed steps); the pool
   comes from the server's published `/metrics` (`cache_config_info`), which is what the
   probe's capacity section reports beside its own fill-until-evict figure (that section is
   left out here: filling a 16,384-token pool several times takes minutes on a shared CPU,
   and tests/probe checks it at a small pool);
3. `ctxlab bench serve --dataset trace` replays the slice (observed), and the profile is
   probed once more right after it: on a shared machine the speed drifts, and the two
   predictions bracket the replay;
4. `ctxlab simulate` replays the same slice with each probed profile, the probed page size
   and the published pool (predicted);
5. the simulator once more with every step's price x 0.9 to 1.1 (`--sweep step-scale=...`):
   how far p50 TTFT moves for a given error in the price (a busy queue amplifies it).
Each of `--rounds` (3) rounds starts a fresh server (a replay must not find the previous
one's prefixes cached) and does all of the above: the machine's drift from one round to the
next is part of the answer. The server's step log then splits any miss in two: each probed
profile's price for the replay's own steps against their real seconds (steps that followed
at least a second of idle apart from the rest), and the simulator run with the replay's own
steps as its profile (what is left is scheduling, not step price).

Why the timestamps are stretched x2 by default: on this project's VMs a step that follows
seconds of idle is slower (a 512-token prefill 1.1-1.2 s back to back, 1.5 s after 10 s of
sleep, 1.9-2.1 s after 30 s; a forward every half second mostly keeps it fast; see
benchmarks/idle_slowdown.py). The probe times steps back to back, so a replay whose server
idles between bursts (x10: 30 s gaps) runs slower than any profile says, and the step log
shows it (docs/deployment.md). At x2 the server is busy through the slice, which in turn
makes TTFT sensitive to the step price (step 5).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import serve_sim_vs_bench
from _serving import CLI, ENV, ROOT, bench, ctxlab_server, gguf_path, load_average
from serve_sim_vs_bench import CHUNK, MAX_RUNNING, MODEL, PAGE, POOL_TOKENS, derive_trace

# shared/data beside the checkout (main) or beside its parent folder (a worktree)
TRACES = [p / "shared" / "data" / "traces" / "conversation_trace.jsonl" for p in ROOT.parents[:2]]


def probe(url: str, out: Path, sections: str = "prefix,profile", longest: int = 60) -> dict:
    cmd = [*CLI, "probe", "--server", url, "--sections", sections,
           "--longest", str(longest), "--yes", "--json", "--out", str(out)]  # fmt: skip
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


def simulate(
    trace: Path, profile: Path, page: int, pool_tokens: int, *extra: str, hash_block: int = PAGE
) -> dict:
    from ctxlab.arch import resolve_arch
    from ctxlab.sim.steptime import ArchCost

    arch = resolve_arch(gguf=Path(gguf_path()))
    pool_bytes = pool_tokens * ArchCost.build(arch, arch.weight_bytes).kv_bytes_per_token
    cmd = [*CLI, "simulate", str(trace), "--gguf", gguf_path(), "--profile", str(profile),
           "--hash-block", str(hash_block), "--page-size", str(page), "--chunk-tokens", str(CHUNK),
           "--max-running", str(MAX_RUNNING), "--pool-bytes", str(pool_bytes), "--json",
           "--out", str(profile.parent / "sim"), *extra]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, check=True)
    return json.loads(res.stdout)


def replay_steps(log: Path, begin: float, end: float) -> list[dict]:
    """The step log's lines that started inside [begin, end] (Unix seconds)."""
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    return [x for x in lines if begin <= x["start"] <= end]


IDLE_S = 1.0  # a step after this much idle is counted apart


def price_check(profile: Path, steps: list[dict]) -> str:
    """Real seconds against the profile's price, for the steps after idle and the rest."""
    from ctxlab.sim.steptime import ProfileStepTime

    fit = ProfileStepTime(profile)
    parts = []
    for name, keep in (("after >= 1 s idle", lambda x: (x["idle_before"] or 0) >= IDLE_S),
                       ("back to back", lambda x: (x["idle_before"] or 0) < IDLE_S)):  # fmt: skip
        chosen = [x for x in steps if keep(x)]
        if chosen:
            real = sum(x["seconds"] for x in chosen)
            priced = sum(fit.price(x) for x in chosen)
            parts.append(f"{name}: {len(chosen)} steps, real / priced {real / priced:.2f} "
                         f"({real:.1f} s / {priced:.1f} s)")  # fmt: skip
    return "; ".join(parts)


def own_profile(steps: list[dict], out: Path) -> Path:
    """The replay's own steps as a profile (what the simulator would get if every step price
    were right), so the simulator's remaining miss is its scheduling."""
    from ctxlab.sim.steptime import PROFILE_FORMAT

    out.write_text(json.dumps({"format": PROFILE_FORMAT, "model": MODEL,
                               "device": "the replay's own steps (ctxlab serve --step-log)",
                               "steps": steps}))  # fmt: skip
    return out


SCALES = "0.9,0.95,1,1.05,1.1"  # the sensitivity sweep of every step's price


def observed_over_predicted(observed: dict, predicted: dict, figure: str) -> float:
    """The bench's p50 `figure` ("ttft" or "tpot", ms) over the simulator's (s)."""
    key = {"ttft": "median_ttft_ms", "tpot": "median_tpot_ms"}[figure]
    return observed[key] / (predicted[f"{figure}_p50"] * 1e3)


@dataclass
class Round:
    """One fresh server: probe, replay, probe again; the predictions and the observation."""

    block: str
    observed: dict
    predicted: list[dict]  # probe before, probe after, the replay's own steps
    page: int
    pool: int
    probe_requests: int
    steps: list[dict]
    profiles: list[Path]
    seconds: float
    loads: tuple[str, str]
    sensitivity: dict[str, float]

    def ratio(self, figure: str, which: int) -> float:
        return observed_over_predicted(self.observed, self.predicted[which], figure)


def one_round(trace: Path, work: Path) -> Round:
    work.mkdir()
    log = work / "steps.jsonl"
    args = ["--model", MODEL, "--dataset", "trace", "--trace", str(trace),
            "--trace-hash-block", str(PAGE), "--ignore-eos", "--metric-percentiles", "50,95",
            "--percentile-metrics", "ttft,tpot,itl,e2el"]  # fmt: skip
    warm = ["--model", MODEL, "--num-prompts", "8", "--input-len", "300", "--output-len", "8",
            "--max-concurrency", "4", "--seed", "99"]  # fmt: skip
    server = ("--threads", "1", "--kv-pool-tokens", str(POOL_TOKENS), "--page-size", str(PAGE),
              "--max-num-batched-tokens", str(CHUNK), "--max-num-seqs", str(MAX_RUNNING),
              "--step-log", str(log))  # fmt: skip
    with ctxlab_server(*server) as url:
        bench(url, warm)
        load0 = load_average()
        doc = probe(url, work / "probe.json")
        pool = published_pool(url)
        begin = time.time()
        block, obs = bench(url, args)
        end = time.time()
        load1 = load_average()
        after = probe(url, work / "probe-after.json", "profile")
    figs = {f["name"]: f for fs in doc["sections"].values() for f in fs}
    page = figs["cache granularity"]["value"]
    profiles = [Path(d["profile_file"]) for d in (doc, after)]
    steps = replay_steps(log, begin, end)
    own = own_profile(steps, work / "replay-own-steps.json")
    # the probe before's prediction is the sweep's x 1 run
    sweep = simulate(trace, profiles[0], page, pool, "--sweep", f"step-scale={SCALES}")
    runs = {r["value"]: r for r in sweep["sweep"]["runs"]}
    sensitivity = {k: r["ttft_p50"] * 1e3 for k, r in runs.items()}
    sims = [runs["1"], *(simulate(trace, prof, page, pool) for prof in (profiles[1], own))]
    kept = {
        "observed": obs,
        "predicted": dict(
            zip(("probe before", "probe after", "replay's own steps"), sims, strict=True)
        ),
        "step_scale_ttft_p50_ms": sensitivity,
    }
    (work / "round.json").write_text(json.dumps(kept, indent=1))  # fmt: skip
    return Round(block, obs, sims, page, pool, doc["sent"]["requests"], steps, profiles,
                 end - begin, (load0, load1), sensitivity)  # fmt: skip


def last_round_table(last, third: str) -> None:
    """The last round's replay block and its figures: predicted from the probe before and
    after the replay, observed, their ratio, and a third prediction (`third` names it)."""
    if last.block:
        print(f"\nthe last round's replay (load average {last.loads[0]} before its probe, "
              f"{last.loads[1]} after):\n\n{last.block}\n")  # fmt: skip
    print("| figure (last round) | predicted, probe before | predicted, probe after | observed | "
          f"observed / predicted | {third} |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for name, sk, ok in (("TTFT", "ttft", "ttft"), ("TPOT", "tpot", "tpot"), ("ITL", "itl", "itl"),
                         ("E2E latency", "e2e", "e2el")):  # fmt: skip
        for q in ("p50", "p95"):
            p = [s[f"{sk}_{q}"] * 1e3 for s in last.predicted]
            o = last.observed[f"{'median' if q == 'p50' else q}_{ok}_ms"]
            goal = " (goal: within 20 %)" if q == "p50" and sk in ("ttft", "tpot") else ""
            print(f"| {name} {q} (ms){goal} | {p[0]:,.1f} | {p[1]:,.1f} | {o:,.1f} | "
                  f"{o / p[0]:.2f} to {o / p[1]:.2f} | {p[2]:,.1f} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--start", type=int, default=6000, help="First request of the window.")
    ap.add_argument("--time-scale", type=float, default=2.0, help="Stretch the timestamps.")
    ap.add_argument("--rounds", type=int, default=3, help="Fresh server, probes and replay, "
                    "this many times: the machine's drift is part of the answer.")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", type=Path, default=None, help="A Mooncake trace .jsonl.")
    a = ap.parse_args()
    found = [a.trace] if a.trace else [p for p in TRACES if p.exists()]
    if found:
        serve_sim_vs_bench.TRACE = found[0]  # derive_trace reads it (synthetic when absent)
    work = Path(tempfile.mkdtemp(prefix="ctxlab-probesim-"))
    trace = work / "trace.jsonl"
    source = derive_trace(trace, a.start, a.requests, a.time_scale, a.seed)
    rounds = []
    for r in range(a.rounds):
        print(f"round {r + 1} of {a.rounds} ...", flush=True)
        rounds.append(one_round(trace, work / f"round-{r + 1}"))
    last = rounds[-1]
    print(f"trace: {source}; scaled as serve_sim_vs_bench.py (pages of {PAGE} tokens), "
          f"timestamps x {a.time_scale:g}")  # fmt: skip
    print(f"probed: page {last.page} tokens; pool {last.pool} tokens from /metrics (configured "
          f"{POOL_TOKENS}); {last.probe_requests} probe requests per probe")  # fmt: skip
    last_round_table(last, "predicted from the replay's own steps")
    print("\nevery round, observed / predicted p50 (goal: 0.80 to 1.20):\n")
    print(
        "| round | TTFT, probe before | TTFT, probe after | TTFT, replay's own steps | "
        "TPOT, probe before | TPOT, probe after | TPOT, replay's own steps | replay (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for i, rd in enumerate(rounds, 1):
        cells = [f"{rd.ratio(f, w):.2f}" for f in ("ttft", "tpot") for w in (0, 1, 2)]
        print(f"| {i} | {' | '.join(cells)} | {rd.seconds:.0f} |")
    for i, rd in enumerate(rounds, 1):
        idle = sum(x["idle_before"] or 0 for x in rd.steps)
        print(f"\nround {i}: {len(rd.steps)} replay steps in the server's step log, "
              f"{idle:.1f} s of the {rd.seconds:.1f} s replay idle between steps")  # fmt: skip
        for label, prof in zip(("probe before", "probe after"), rd.profiles, strict=True):
            print(f"- {label}: {price_check(prof, rd.steps)}")
        sens = ", ".join(f"x{k}: {v:,.0f} ms" for k, v in rd.sensitivity.items())
        print(f"- predicted p50 TTFT (probe before) with every step's price scaled: {sens}")
    print(f"\nfiles in {work}")


if __name__ == "__main__":
    main()
