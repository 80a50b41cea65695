"""Does a probe of a vLLM server let the simulator predict that server? probe_sim_vs_bench.py's
question asked of vLLM, the reference deployment. Goal: p50 TTFT and p50 TPOT within 20 % of
what `ctxlab bench serve` observes replaying one Mooncake slice against the same vLLM.

    make vllm && ctxlab export-hf smollm2-135m
    .venv/bin/python benchmarks/probe_sim_vs_vllm.py                   # eager, x4, 2 rounds
    .venv/bin/python benchmarks/probe_sim_vs_vllm.py --compiled --time-scale 2

The slice and its scaling are probe_sim_vs_bench.py's (the same 48 Mooncake requests, every
512-token hash block 8 tokens, outputs / 16). vLLM serves SmolLM2 in float32 (no bf16 kernel
on this AVX2-only CPU), one thread, with the ctxlab server's limits of that script: steps of
at most 512 tokens (`--max-num-batched-tokens`, chunked prefill) and 16 requests
(`--max-num-seqs`), a 16,384-token pool (`--num-gpu-blocks-override 128` of its 128-token
blocks). One server for every round (a vLLM start takes minutes here); before each replay
its prefix cache is emptied (`POST /reset_prefix_cache`, vLLM's dev mode), so no round finds
the previous one's prefixes. Each round:
1. `ctxlab probe --sections prefix,profile` (page and step profile, from outside);
2. `ctxlab bench serve --dataset trace` replays the slice (observed), with vLLM's `/metrics`
   read just before and just after it;
3. `ctxlab probe --sections profile` once more (the machine drifts; the two bracket it);
4. `ctxlab simulate` with each profile, the probed page, the published pool and the limits.

vLLM has no step log, so the split of a miss into step price and scheduling uses what vLLM
publishes, as differences of its `/metrics` across the replay: the engine steps it ran and
the tokens in them (`vllm:iteration_tokens_total`, one observation per engine step), the mean
inter-token latency (`vllm:inter_token_latency_seconds`), the mean queue time
(`vllm:request_queue_time_seconds`), the mean prefill time (`vllm:request_prefill_time_seconds`:
first scheduled to first token; the simulator's TTFT less its queueing) and prefix-cache hits,
each beside the simulator's own. One more simulator run is a diagnosis, not a prediction (it
reads the observation): the probe's decode and mixed step prices scaled until the simulated
p50 ITL is the replay's (`own_price`), the prefill prices left as probed. If TTFT and TPOT
then agree, the miss was the decode price; if they still miss, it is the prefill price or the
scheduling, and the prefill and queue columns say which.

`--from DIR` simulates and prints the rounds a run left in DIR again, without a server.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import serve_sim_vs_bench
from _serving import bench, load_average, post, vllm_server
from probe_sim_vs_bench import (
    SCALES,
    TRACES,
    last_round_table,
    observed_over_predicted,
    probe,
    simulate,
)
from serve_sim_vs_bench import CHUNK, MAX_RUNNING, MODEL, PAGE, POOL_TOKENS, derive_trace

VLLM_BLOCK = 128  # vLLM's CPU block size
# histogram sums and counts, counters: what the split reads from vLLM's /metrics
SERIES = (
    "vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_sum",
    "vllm:inter_token_latency_seconds_count", "vllm:inter_token_latency_seconds_sum",
    "vllm:request_queue_time_seconds_count", "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_count", "vllm:request_prefill_time_seconds_sum",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
)  # fmt: skip


def regroup(trace: Path, out: Path, block: int) -> Path:
    """The slice with one hash id per `block` tokens (a chain of the PAGE-token ids it
    covers), for the simulator, whose page must divide the hash block: vLLM reuses a
    128-token block only when all its tokens and its prefix match, which is exactly when the
    chain of the 16 ids up to its end matches. A partial last block gets an id too (the
    simulator never shares a partial page, nor does vLLM)."""
    per = block // PAGE
    with out.open("w") as f:
        for line in trace.read_text().splitlines():
            r = json.loads(line)
            ids = r["hash_ids"]
            chained = [hash(tuple(ids[: k + per])) & (2**62 - 1) for k in range(0, len(ids), per)]
            f.write(json.dumps({**r, "hash_ids": chained}) + "\n")
    return out


def vllm_metrics(url: str) -> dict[str, float]:
    """The SERIES, each summed over its label sets."""
    from ctxlab.probe.metrics import parse

    with urllib.request.urlopen(f"{url}/metrics") as r:
        samples = parse(r.read().decode())
    out = dict.fromkeys(SERIES, 0.0)
    for name, _, value in samples:
        if name in out:
            out[name] += value
    return out


def reset_prefix_cache(url: str) -> None:
    post(f"{url}/reset_prefix_cache", "empty its prefix cache")


@dataclass
class VllmReplay:
    """vLLM's own account of the replay: its /metrics after minus before."""

    d: dict[str, float]

    @property
    def steps(self) -> int:
        return round(self.d["vllm:iteration_tokens_total_count"])

    @property
    def step_tokens(self) -> int:
        return round(self.d["vllm:iteration_tokens_total_sum"])

    def mean(self, series: str) -> float:
        # a round measured before the prefill count was read: one per request as the queue's
        n = self.d.get(f"{series}_count", self.d["vllm:request_queue_time_seconds_count"])
        return self.d[f"{series}_sum"] / n if n else float("nan")

    @property
    def reused(self) -> int:
        return round(self.d["vllm:prefix_cache_hits_total"])

    @property
    def queried(self) -> int:
        return round(self.d["vllm:prefix_cache_queries_total"])


@dataclass
class Round:
    """One round's files (round.json, the probes, the regrouped slice) and what the
    simulator predicts from them."""

    dir: Path
    block: str | None
    observed: dict
    predicted: list[dict]  # probe before, probe after, probe before at the replay's decode price
    own_scale: float  # the decode-price scale at which the simulated ITL p50 is the replay's
    replay: VllmReplay
    page: int
    pool: int
    probe_requests: int
    seconds: float
    loads: tuple[str, str]
    sensitivity: dict[str, float]

    def ratio(self, figure: str, which: int) -> float:
        return observed_over_predicted(self.observed, self.predicted[which], figure)

    @classmethod
    def load(cls, work: Path) -> Round:
        """Simulate the round in `work` with each probe's profile (and the split's run)."""
        kept = json.loads((work / "round.json").read_text())
        doc = json.loads((work / "probe.json").read_text())
        figs = {f["name"]: f for fs in doc["sections"].values() for f in fs}
        page = figs["cache granularity"]["value"]
        if not isinstance(page, int):
            raise RuntimeError(
                f"the probe did not resolve vLLM's page: {figs['cache granularity']}"
            )
        profiles = [work / "probe-step-profile.json", work / "probe-after-step-profile.json"]
        pool = json.loads(profiles[0].read_text())["engine"]["pool_tokens"]  # from /metrics
        paged = work / f"trace-{page}.jsonl"
        if not paged.exists():
            regroup(work.parent / "trace.jsonl", paged, page)
        sweep = simulate(paged, profiles[0], page, pool, "--sweep", f"step-scale={SCALES}",
                         hash_block=page)  # fmt: skip
        runs = {r["value"]: r for r in sweep["sweep"]["runs"]}
        sensitivity = {k: r["ttft_p50"] * 1e3 for k, r in runs.items()}
        replay = VllmReplay(kept["vllm_metrics_delta"])
        after = simulate(paged, profiles[1], page, pool, hash_block=page)
        obs = kept["observed"]
        scale, own = own_price(paged, profiles[0], page, pool, obs)
        return cls(work, kept.get("block"), obs, [runs["1"], after, own], scale, replay, page,
                   pool, doc["sent"]["requests"], kept.get("seconds", obs["duration"]),
                   tuple(kept["loads"]), sensitivity)  # fmt: skip


def decode_priced(profile: Path, scale: float, out: Path) -> Path:
    """`profile` with the seconds of its decode and mixed steps x `scale` (prefill as is)."""
    doc = json.loads(profile.read_text())
    doc["steps"] = [
        {**x, "seconds": x["seconds"] * scale} if x["kind"] != "prefill" else x
        for x in doc["steps"]
    ]
    out.write_text(json.dumps(doc))
    return out


def own_price(
    paged: Path, profile: Path, page: int, pool: int, observed: dict
) -> tuple[float, dict]:
    """The split's run: the probe's decode (and mixed) step prices scaled until the
    simulator's p50 inter-token latency is the replay's own (a decode step's seconds, as
    the client saw them), the prefill prices left as probed; bisection on the scale. The
    scale says how far the probe's decode price was from the replay's own decode steps;
    what the simulator still misses at that price is its prefill price and its scheduling.
    A diagnosis, not a prediction: it reads the observation."""
    target = observed["median_itl_ms"] / 1e3
    out = profile.with_name("decode-priced-profile.json")
    lo, hi, run = 0.25, 8.0, {}
    for _ in range(9):
        mid = (lo * hi) ** 0.5
        run = simulate(paged, decode_priced(profile, mid, out), page, pool, hash_block=page)
        lo, hi = (mid, hi) if run["itl_p50"] < target else (lo, mid)
    return (lo * hi) ** 0.5, run


def one_round(url: str, trace: Path, work: Path) -> None:
    """Probe, replay (with vLLM's /metrics around it), probe again on `url`; the files."""
    work.mkdir()
    args = ["--model", MODEL, "--dataset", "trace", "--trace", str(trace),
            "--trace-hash-block", str(PAGE), "--ignore-eos", "--metric-percentiles", "50,95",
            "--percentile-metrics", "ttft,tpot,itl,e2el"]  # fmt: skip
    load0 = load_average()
    doc = probe(url, work / "probe.json", longest=300)
    reset_prefix_cache(url)
    m0 = vllm_metrics(url)
    begin = time.time()
    block, obs = bench(url, args)
    end = time.time()
    m1 = vllm_metrics(url)
    load1 = load_average()
    probe(url, work / "probe-after.json", "profile", longest=300)
    figs = {f["name"]: f for fs in doc["sections"].values() for f in fs}
    page = figs["cache granularity"]["value"]
    if isinstance(page, int):
        regroup(trace, work / f"trace-{page}.jsonl", page)
    kept = {
        "observed": obs,
        "vllm_metrics_delta": {k: m1[k] - m0[k] for k in SERIES},
        "loads": [load0, load1],
        "seconds": end - begin,
        "block": block,
    }
    (work / "round.json").write_text(json.dumps(kept, indent=1))


def split_table(rounds: list[Round]) -> None:
    print(
        "\nthe split, per round: vLLM's /metrics across the replay against the simulator "
        "(probe before / probe after / probe before at the replay's decode price):\n"
    )
    print("| round | engine steps, vLLM | steps, simulated | tokens in steps, vLLM | "
          "mean ITL ms, vLLM | mean ITL ms, simulated | mean queue ms, vLLM | "
          "mean queue ms, simulated | mean prefill ms, vLLM | mean prefill ms, simulated | "
          "reused tokens, vLLM | reused, simulated | "
          "preemptions, vLLM | simulated |")  # fmt: skip
    print("|---|" + "---:|" * 13)
    for i, rd in enumerate(rounds, 1):
        p = rd.predicted
        r = rd.replay
        cells = [
            f"{r.steps}", " / ".join(f"{s['steps']}" for s in p), f"{r.step_tokens:,}",
            f"{r.mean('vllm:inter_token_latency_seconds') * 1e3:.1f}",
            " / ".join(f"{s['itl_mean'] * 1e3:.1f}" for s in p),
            f"{r.mean('vllm:request_queue_time_seconds') * 1e3:,.0f}",
            " / ".join(f"{s['queue_mean'] * 1e3:,.0f}" for s in p),
            f"{r.mean('vllm:request_prefill_time_seconds') * 1e3:,.0f}",
            " / ".join(f"{(s['ttft_mean'] - s['queue_mean']) * 1e3:,.0f}" for s in p),
            f"{r.reused:,} of {r.queried:,}",
            " / ".join(f"{s['reused_tokens']:,} of {s['queried_tokens']:,}" for s in p),
            f"{round(r.d['vllm:num_preemptions_total'])}",
            " / ".join(f"{s['preemptions']}" for s in p),
        ]  # fmt: skip
        print(f"| {i} | {' | '.join(cells)} |")


def report(work: Path, header: list[str]) -> None:
    """Simulate every round under `work` and print the tables."""
    rounds = [Round.load(d) for d in sorted(work.glob("round-*")) if (d / "round.json").exists()]
    if not rounds:
        raise SystemExit(f"no finished round (round-*/round.json) in {work}")
    last = rounds[-1]
    print("\n".join(header))
    print(f"probed: page {last.page} tokens; pool {last.pool} tokens from /metrics; "
          f"{last.probe_requests} probe requests per probe")  # fmt: skip
    last_round_table(last, "at the replay's decode price (diagnosis)")
    print("\nevery round, observed / predicted p50 (goal: 0.80 to 1.20):\n")
    print("| round | TTFT, probe before | TTFT, probe after | TTFT at the replay's decode price | "
          "TPOT, probe before | TPOT, probe after | TPOT at the replay's decode price | "
          "replay's decode price / probe's | replay (s) | load before / after |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for i, rd in enumerate(rounds, 1):
        cells = [f"{rd.ratio(f, w):.2f}" for f in ("ttft", "tpot") for w in (0, 1, 2)]
        print(f"| {i} | {' | '.join(cells)} | {rd.own_scale:.2f} | {rd.seconds:.0f} | "
              f"{rd.loads[0]} / {rd.loads[1]} |")  # fmt: skip
    split_table(rounds)
    for i, rd in enumerate(rounds, 1):
        sens = ", ".join(f"x{k}: {v:,.0f} ms" for k, v in rd.sensitivity.items())
        print(f"\nround {i}: predicted p50 TTFT (probe before) with every step's price "
              f"scaled: {sens}")  # fmt: skip
    print(f"\nfiles in {work}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--start", type=int, default=6000, help="First request of the window.")
    ap.add_argument("--time-scale", type=float, default=4.0, help="Stretch the timestamps.")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--compiled", action="store_true", help="vLLM compiled (not eager).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", type=Path, default=None, help="A Mooncake trace .jsonl.")
    ap.add_argument("--from", dest="again", type=Path, default=None,
                    help="Simulate and print the rounds a previous run left in this folder "
                    "(no server).")  # fmt: skip
    a = ap.parse_args()
    if a.again is not None:
        report(a.again, [f"rounds measured earlier, in {a.again}"])
        return
    from ctxlab.hf.export import export_folder

    found = [a.trace] if a.trace else [p for p in TRACES if p.exists()]
    if found:
        serve_sim_vs_bench.TRACE = found[0]
    work = Path(tempfile.mkdtemp(prefix="ctxlab-probesim-vllm-"))
    trace = work / "trace.jsonl"
    source = derive_trace(trace, a.start, a.requests, a.time_scale, a.seed)
    extra = ("--max-num-batched-tokens", str(CHUNK), "--max-num-seqs", str(MAX_RUNNING),
             "--num-gpu-blocks-override", str(POOL_TOKENS // VLLM_BLOCK))  # fmt: skip
    warm = ["--model", MODEL, "--num-prompts", "8", "--input-len", "300", "--output-len", "8",
            "--max-concurrency", "4", "--seed", "99"]  # fmt: skip
    mode = "compiled" if a.compiled else "eager (--enforce-eager)"
    t0 = time.monotonic()
    with vllm_server(str(export_folder(MODEL)), MODEL, "float32", 1, not a.compiled, extra,
                     {"VLLM_SERVER_DEV_MODE": "1"}, 2048, work / "vllm.log") as url:  # fmt: skip
        started = time.monotonic() - t0
        print(f"vLLM {mode} healthy after {started:.0f} s (load {load_average()})", flush=True)
        bench(url, warm)
        for r in range(a.rounds):
            print(f"round {r + 1} of {a.rounds} ...", flush=True)
            one_round(url, trace, work / f"round-{r + 1}")
    took = time.monotonic() - t0
    report(work, [
        f"server: vLLM 0.32.0 CPU, {mode}, float32, one thread, --max-num-batched-tokens "
        f"{CHUNK}, --max-num-seqs {MAX_RUNNING}, {POOL_TOKENS // VLLM_BLOCK} blocks; started "
        f"in {started:.0f} s, the measurement took {took:.0f} s",
        f"trace: {source}; scaled as serve_sim_vs_bench.py (hash blocks of {PAGE} tokens), "
        f"timestamps x {a.time_scale:g}",
    ])  # fmt: skip


if __name__ == "__main__":
    main()
