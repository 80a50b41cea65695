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
import re
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


def _phase(stderr: str, name: str) -> float:
    """Seconds a phase took, from its plain progress line ("NAME: done (N s)"); a phase
    under a second prints no line, and counts as 0.5."""
    found = re.findall(rf"^{re.escape(name)}.*: done \((\d+) s\)$", stderr, re.M)
    return float(found[-1]) if found else 0.5


def run_once(cache: Path) -> tuple[float, float, float]:
    env = {**os.environ, "CTXLAB_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [*_ctxlab(), *COMMAND], env=env, capture_output=True, text=True, timeout=600
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"ctxlab generate failed:\n{proc.stderr}")
    return elapsed, _phase(proc.stderr, "loading SmolLM2"), _phase(proc.stderr, "loading the tok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="cold/warm pairs to run")
    args = parser.parse_args()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    cold, warm, cold_tok, warm_tok, load = [], [], [], [], []
    root = Path(tempfile.mkdtemp(prefix="ctxlab-startup-"))
    try:
        for i in range(args.repeats):
            cache = root / f"run{i}"
            total, weights, tok = run_once(cache)  # empty cache: builds and saves the tokenizer
            cold.append(total)
            cold_tok.append(tok)
            load.append(weights)
            total, weights, tok = run_once(cache)  # the same cache: loads tokenizer.json
            warm.append(total)
            warm_tok.append(tok)
            load.append(weights)
            print(f"pair {i + 1}: cold {cold[-1]:.1f} s, warm {warm[-1]:.1f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"command: ctxlab {' '.join(COMMAND)!s}")
    print(f"cold start (tokenizer built from the GGUF): median {c:.1f} s of {len(cold)}")
    print(f"warm start (tokenizer.json from the cache):  median {w:.1f} s of {len(warm)}")
    print(f"cold / warm: {c / w:.2f}x; saved {c - w:.1f} s per process")
    print(
        f"tokenizer phase: cold median {statistics.median(cold_tok):.0f} s, warm median "
        f"{statistics.median(warm_tok):.1f} s; weights phase median "
        f"{statistics.median(load):.0f} s (from the plain progress lines; 0.5 = under a second)"
    )
    print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}")


if __name__ == "__main__":
    main()
