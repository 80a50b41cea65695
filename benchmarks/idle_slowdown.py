"""Is a step slower when the engine sat idle before it? The same 512-token prefill, timed back
to back and after idle periods of several lengths, three ways:

- `sleep`: the process sleeps through the idle period (a server waiting for requests);
- `spin`: the process busy-waits in Python (the CPU stays busy, the weights untouched);
- `touch`: a 4-token forward every half second (every weight read again, little compute).

    .venv/bin/python benchmarks/idle_slowdown.py            # idle 0, 1, 3, 10, 30 s
    .venv/bin/python benchmarks/idle_slowdown.py --idle 0,5 --repeats 4

If `sleep` and `spin` are slow after idle and `touch` is not, what slows the step is memory
left untouched (below the process: the kernel or the host), not the CPU's clock. A step
profile is measured back to back (`ctxlab profile`, `ctxlab probe`), so on such a machine a
server that idles between bursts runs its first steps slower than any profile says; the
step log of `ctxlab serve --step-log` shows it in a replay (docs/deployment.md).
Prints one row per mode and idle length: the median and the range of the prefill's seconds,
and its ratio to the same mode's first idle length (0: back to back).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ctxlab.engine import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--idle", default="0,1,3,10,30", help="Idle seconds; the first is the reference."
    )
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512)
    a = ap.parse_args()
    idles = [float(x) for x in a.idle.split(",")]
    torch.set_num_threads(1)
    llm = LLM("smollm2-135m", block_size=8, max_num_batched_tokens=a.tokens)
    rng = random.Random(0)
    one = SamplingParams(max_tokens=1)

    def prompt(n: int) -> list[int]:  # fresh tokens: nothing is cached
        return [rng.randrange(1000, 40000) for _ in range(n)]

    def prefill() -> float:
        t0 = time.perf_counter()
        llm.generate([prompt(a.tokens)], one)
        return time.perf_counter() - t0

    def spin(s: float) -> None:
        end = time.perf_counter() + s
        while time.perf_counter() < end:
            pass

    def touch(s: float) -> None:
        end = time.perf_counter() + s
        while time.perf_counter() < end:
            llm.generate([prompt(4)], one)
            time.sleep(0.5)

    modes: dict[str, Callable[[float], None]] = {"sleep": time.sleep, "spin": spin, "touch": touch}
    for _ in range(2):
        prefill()  # warm: first-call allocations
    print(f"{a.tokens}-token prefill, one thread, {a.repeats} repeats per cell\n")
    print(f"| mode | idle before (s) | median (ms) | range (ms) | x idle {idles[0]:g} s |")
    print("|---|---:|---:|---:|---:|")
    for name, wait in modes.items():
        base = None
        for idle in idles:
            times = []
            for _ in range(a.repeats):
                prefill()  # the idle period starts right after a step, as in a server
                wait(idle)
                times.append(prefill())
            med = statistics.median(times)
            base = med if base is None else base
            print(f"| {name} | {idle:g} | {med * 1e3:,.0f} | {min(times) * 1e3:,.0f} to "
                  f"{max(times) * 1e3:,.0f} | {med / base:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
