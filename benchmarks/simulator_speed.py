"""How fast the simulator replays the full Mooncake conversation trace.

12,031 requests, about 145M input tokens, llama-3.1-70b on 80 GiB H100s. BF16 weights of a
70B model (141 GB) do not fit one 80 GiB device, so the replay uses tensor parallelism over
`--gpus` devices (4 by default, a common deployment); the pool is what they leave. Prints
simulated requests per wall second and simulated time over wall time. Goal: the whole trace
in under 20 s of wall time on one core.

    .venv/bin/python benchmarks/simulator_speed.py [--trace PATH] [--gpus 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ctxlab.arch import get_preset
from ctxlab.plan.devices import get_device
from ctxlab.plan.units import fmt_bytes
from ctxlab.sim.config import SimConfig
from ctxlab.sim.run import simulate
from ctxlab.sim.trace import read_mooncake

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared/data/traces/conversation_trace.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT)
    ap.add_argument("--gpus", type=int, default=4)
    args = ap.parse_args()
    if not args.trace.exists():
        print(f"trace {args.trace} is absent; pass --trace", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    trace = read_mooncake(args.trace)
    t_read = time.perf_counter() - t0
    arch, device = get_preset("llama-3.1-70b"), get_device("h100")
    cfg = SimConfig(gpus=args.gpus)
    t1 = time.perf_counter()
    res = simulate(trace, arch, device, cfg)
    wall = time.perf_counter() - t1
    m = res.metrics
    print(f"trace: {args.trace.name}, {len(trace):,} requests, {trace.input_tokens:,} input tokens")
    print(
        f"setup: {arch.name} on {args.gpus} x {device.name} (80 GiB each), pool "
        f"{fmt_bytes(res.setup.pool_bytes)}, page 16, chunk 2048, {res.step_model}"
    )
    print(f"read trace: {t_read:.2f} s wall; simulate: {wall:.2f} s wall, {m['steps']:,} steps")
    print(
        f"simulated time: {m['makespan_s']:,.0f} s; simulated/wall: {m['makespan_s'] / wall:,.0f}x"
    )
    print(f"simulated requests per wall second: {len(trace) / wall:,.0f}")
    print(
        f"reused token fraction {m['reused_token_fraction']:.3f}, preemptions "
        f"{m['preemptions']:,}, evictions {m['evictions']:,}, peak running "
        f"{m['peak_running_requests']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
