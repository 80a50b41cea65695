"""Where a fresh process's model load goes: `import torch`, the tokenizer, the weights, with
the weights cache on and off side by side.

Each repeat starts two fresh processes, alternating: one with the weights cache
(`ctxlab.model.weights_cache`, filled by an untimed first run) and one with
`CTXLAB_WEIGHTS_CACHE=0` (the GGUF dequantized as before the cache). Each prints the
seconds of its three phases; the script prints the medians and the ratio of the weights
phase, with the load average (timings on a shared machine are noisy: read the ratio).

    PYTHONPATH=. .venv/bin/python benchmarks/model_load_phases.py --repeats 3 [--model NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from ctxlab.model.registry import resolve_model_path
from ctxlab.model.tokenizer import load_tokenizer
load_tokenizer(str(resolve_model_path(sys.argv[1])))
t2 = time.perf_counter()
from ctxlab.model.loader import load_model
load_model(sys.argv[1])
t3 = time.perf_counter()
print(json.dumps({"import torch": t1 - t0, "tokenizer": t2 - t1, "weights": t3 - t2}))
"""


def _run(model: str, cache: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CTXLAB_WEIGHTS_CACHE": "1" if cache else "0"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    load_before = Path("/proc/loadavg").read_text().split()[0]
    _run(args.model, True)  # untimed: fills the tokenizer and weights caches
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for i in range(args.repeats):
        for cache in (True, False) if i % 2 == 0 else (False, True):
            runs[cache].append(_run(args.model, cache))
    phases = list(runs[True][0])
    print(f"model {args.model}, {args.repeats} fresh processes each, median seconds:")
    print("| weights cache | " + " | ".join(phases) + " |")
    print("|---|" + "---|" * len(phases))
    for cache in (True, False):
        cells = [f"{statistics.median(r[p] for r in runs[cache]):.2f}" for p in phases]
        print(f"| {'on' if cache else 'off'} | " + " | ".join(cells) + " |")
    on = statistics.median(r["weights"] for r in runs[True])
    off = statistics.median(r["weights"] for r in runs[False])
    print(f"weights phase, cache on / off: {on / off:.2f}")
    print(
        f"load average before {load_before}, after {Path('/proc/loadavg').read_text().split()[0]}"
    )


if __name__ == "__main__":
    main()
