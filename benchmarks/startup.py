"""Cold and warm start of `ctxlab generate`, side by side in one run.

Cold: an empty tokenizer cache (a fresh CTXLAB_CACHE_DIR), so the process builds the
tokenizer from the GGUF vocabulary as every process did before the cache. Warm: the same
folder again, so the tokenizer loads from `tokenizer.json`. The runs alternate (cold, warm,
cold, warm, ...) so a change in the machine's load hits both alike; the script prints the
median wall time of each, the ratio, the load average before and after, and the time the
plain progress lines report for the tokenizer.

    .venv/bin/python benchmarks/startup.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = ["generate", "The capital of France is", "--max-tokens", "4"]


def _ctxlab() -> list[str]:
    script = Path(sys.executable).with_name("ctxlab")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from ctxlab.cli import main; main()"]


def run_once(cache: Path) -> float:
    env = {**os.environ, "CTXLAB_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [*_ctxlab(), *COMMAND], env=env, capture_output=True, text=True, timeout=600
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"ctxlab generate failed:\n{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="cold/warm pairs to run")
    args = parser.parse_args()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    cold, warm = [], []
    root = Path(tempfile.mkdtemp(prefix="ctxlab-startup-"))
    try:
        for i in range(args.repeats):
            cache = root / f"run{i}"
            cold.append(run_once(cache))  # empty cache: builds and saves the tokenizer
            warm.append(run_once(cache))  # the same cache: loads tokenizer.json
            print(f"pair {i + 1}: cold {cold[-1]:.1f} s, warm {warm[-1]:.1f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"command: ctxlab {' '.join(COMMAND)!s}")
    print(f"cold start (tokenizer built from the GGUF): median {c:.1f} s of {len(cold)}")
    print(f"warm start (tokenizer.json from the cache):  median {w:.1f} s of {len(warm)}")
    print(f"cold / warm: {c / w:.2f}x; saved {c - w:.1f} s per process")
    print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}")


if __name__ == "__main__":
    main()
