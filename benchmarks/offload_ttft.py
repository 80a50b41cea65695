"""The prefix cache's offload tier, measured: TTFT of a long prefix four ways, and
demonstration 4's workload with and without the tier beside the simulator's prediction.

    .venv/bin/python benchmarks/offload_ttft.py                  # 2K prefix, 3 repeats, + workload
    .venv/bin/python benchmarks/offload_ttft.py --prefix 1024 --repeats 2 --no-workload

Model: smollm2-135m (30 layers, 3 KV heads of 64), float32, pages of 16 tokens, `--threads`
torch threads. Prompts: the bundled essay text, tokenized, each repeat a fresh prefix.

1. TTFT of a `--prefix`-token prefix plus a 16-token suffix, max_tokens 1, one request at a
   time, on an engine whose pool holds exactly one such request:
   - recompute: the prefix sent cold (nothing cached; what an evicted prefix costs without a
     tier, since the engine recomputes it the same way);
   - hit: the same prefix again with a new suffix (still in the pool);
   - host restore: another prefix of the same length evicts it into a host-memory tier,
     then the first prefix comes back with a new suffix (`--offload-bytes` host memory);
   - disk restore: the same on an engine whose tier is disk only (host 0, block files in a
     temporary directory; page cache warm, as right after the eviction).
   Medians of `--repeats`; the ratio recompute / host restore is the issue's goal (>= 5x).
   Tokens of the restored request are checked against the cold one's (greedy).
2. Demonstration 8 of the workshop (`ctxlab.workshop.demo_offload`) at the default config's
   sizes (`--quick`: its quick sizes): demonstration 4's interleaved workload on the engine
   without and with the tier, and the simulator with a measured step profile and transfer
   profile on the same list; its tables are printed as the report prints them, and the
   simulator's TTFT p50 error against the engine's.

Times are wall-clock on whatever else the machine runs (the 1-minute load is printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.model import load_model

SUFFIX = 16
PAGE = 16


def load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def essay_ids(tok, n: int) -> list[int]:
    from ctxlab.eval.vocab import essay_text

    ids = tok.encode(essay_text()[: n * 8])
    if len(ids) < n:
        raise SystemExit(f"the bundled text has only {len(ids)} tokens")
    return ids


def ttft_four_ways(loaded, prefix: int, repeats: int, host_bytes: int) -> dict:
    need = prefix + SUFFIX + 1
    pool = -(-need // PAGE) * PAGE  # exactly one request: the next long prompt evicts it all
    ids = essay_ids(loaded.tokenizer, (2 * repeats + 1) * prefix + 8 * SUFFIX * repeats)
    cursor = [0]

    def take(n: int) -> list[int]:
        out = ids[cursor[0] : cursor[0] + n]
        cursor[0] += n
        return out

    params = SamplingParams(max_tokens=1)
    out: dict[str, list[float]] = {"recompute": [], "hit": [], "host": [], "disk": []}
    same = []
    for tier in ("host", "disk"):
        with tempfile.TemporaryDirectory(prefix="ctxlab-offload-bench-") as tmp:
            eng = LLMEngine(
                loaded.model, loaded.config, loaded.tokenizer, kv_pool_tokens=pool,
                block_size=PAGE, max_num_seqs=1, max_num_batched_tokens=4096, model_id="bench",
            )  # fmt: skip
            off = eng.attach_offload(host_bytes, None) if tier == "host" else (
                eng.attach_offload(0, tmp)
            )  # fmt: skip
            warm = take(64)
            eng.run_all([eng.add_request(warm, params)])
            for _ in range(repeats):
                p, q = take(prefix), take(prefix)

                def send(ids_: list[int], eng: LLMEngine = eng):
                    (o,) = eng.run_all([eng.add_request(ids_, params)])
                    return o

                cold = send(p + take(SUFFIX))
                out["recompute"].append(cold.metrics.ttft)
                hit = send(p + take(SUFFIX))
                assert hit.metrics.reused_tokens >= prefix - PAGE, hit.metrics.reused_tokens
                out["hit"].append(hit.metrics.ttft)
                send(q + take(SUFFIX))  # evicts p into the tier
                before = off.stats().external_prefix_cache_hits
                back = send(p + cold.prompt_token_ids[prefix:])  # p with the cold suffix
                restored = off.stats().external_prefix_cache_hits - before
                assert restored >= prefix - PAGE, f"only {restored} tokens restored"
                out[tier].append(back.metrics.ttft)
                same.append(back.token_ids == cold.token_ids)
            st = off.stats()
            out[f"{tier}_stats"] = st  # type: ignore[assignment]
            off.close()
    res = {k: statistics.median(v) for k, v in out.items() if not k.endswith("_stats")}
    res["samples"] = {k: v for k, v in out.items() if not k.endswith("_stats")}
    res["same_tokens"] = all(same)
    res["stats"] = {t: out[f"{t}_stats"] for t in ("host", "disk")}
    res["pool"] = pool
    return res


def workload(loaded, quick: bool) -> None:
    from ctxlab.progress import progress
    from ctxlab.workshop import demo_offload
    from ctxlab.workshop.config_file import load_config
    from ctxlab.workshop.result import fmt
    from ctxlab.workshop.session import Session

    cfg = load_config(None, quick=quick)
    with tempfile.TemporaryDirectory(prefix="ctxlab-offload-ws-") as tmp:
        session = Session(cfg, loaded, Path(tmp), quick=quick)
        with progress("demonstration 8", demo_offload.steps(session)) as tracker:
            res = demo_offload.run(session, tracker)
    for table in res.tables:
        print(f"\n{table.title}")
        print(" | ".join(c.name for c in table.columns))
        for row in table.rows:
            cols = table.columns
            cells = [
                fmt(v, c.digits) if v is not None else "-" for v, c in zip(row, cols, strict=True)
            ]
            print(" | ".join(cells))
        print(f"({table.note})")
    obs = res.observations["sim_vs_engine_ttft_p50_ms"]
    err = (obs.observed - obs.baseline) / obs.baseline
    print(
        f"\nsimulator TTFT p50 {obs.observed:,.1f} ms against the engine's {obs.baseline:,.1f} "
        f"ms with the tier: {100 * err:+.1f} % (goal: within 25 %)"
    )
    for g in res.gains:
        print(f"\n{g.what}:\n  storage: {g.storage}\n  product: {g.product}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=int, default=2048, help="prefix tokens (part 1)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each case (part 1)")
    ap.add_argument("--offload-bytes", type=int, default=512 << 20, help="host tier bytes")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--no-workload", action="store_true", help="skip part 2")
    ap.add_argument("--quick", action="store_true", help="part 2 at the workshop's quick sizes")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model("smollm2-135m", dtype="float32")
    _ = loaded.tokenizer
    print(f"load average at start: {load():.2f} (2 cores shared with other work)")
    r = ttft_four_ways(loaded, args.prefix, args.repeats, args.offload_bytes)
    kv_bytes = r["stats"]["host"].kv_offload_load_bytes / max(1, args.repeats)
    print(
        f"\n1. TTFT of a {args.prefix}-token prefix + {SUFFIX}-token suffix "
        f"(pool {r['pool']} tokens, median of {args.repeats}; {kv_bytes / 2**20:.1f} MiB of "
        "KV restored per request)"
    )
    print(f"{'case':<14}{'TTFT ms':>10}   samples ms")
    for case in ("hit", "host", "disk", "recompute"):
        name = {"host": "host restore", "disk": "disk restore"}.get(case, case)
        samples = ", ".join(f"{x * 1e3:.0f}" for x in r["samples"][case])
        print(f"{name:<14}{r[case] * 1e3:>10.1f}   {samples}")
    for tier in ("host", "disk"):
        st = r["stats"][tier]
        print(
            f"{tier} tier: restore queue wait p50 {st.load_wait_p50_s * 1e3:.2f} ms, p99 "
            f"{st.load_wait_p99_s * 1e3:.2f} ms; {st.kv_offload_load_time:.3f} s restoring "
            f"{st.kv_offload_load_bytes / 2**20:.1f} MiB"
        )
    ratio = r["recompute"] / r["host"]
    print(
        f"recompute / host restore: {ratio:.1f}x (goal >= 5x); recompute / disk restore: "
        f"{r['recompute'] / r['disk']:.1f}x; restored requests gave the cold request's tokens: "
        f"{r['same_tokens']}"
    )
    if not args.no_workload:
        print("\n2. Demonstration 8: demonstration 4's workload without and with the tier")
        workload(loaded, args.quick)
    print(f"\nload average at end: {load():.2f}")


if __name__ == "__main__":
    main()
