"""The kvpress side of benchmarks/vs_kvpress.py, as the benchmark's own process drives it.

kvpress needs its own transformers, so it cannot run in this process: `run_kvpress` writes
every (row, sample) job as JSON lines, starts `_kvpress_worker.py` with the kvpress venv's
python and returns at once (so the ctxlab sides can run meanwhile); `read_kvpress` waits for
it and reads its records back. The job and record format is the contract with the worker,
so it lives in one place beside it, as the ctxlab.hf side does in `_hf_side.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _kvpress_env import WORKER, venv_python


def run_kvpress(
    venv: Path, gguf: Path, rows: list[tuple[str, float]], samples: list[dict], eos, threads: int
) -> subprocess.Popen:
    """Start the worker on every (row, sample); returns the process (results in .out_path)."""
    tmp = Path(tempfile.mkdtemp(prefix="vs_kvpress_"))
    jobs = tmp / "jobs.jsonl"
    with jobs.open("w") as fh:
        for row in rows:
            for smp in samples:
                job = {
                    "row": list(row),
                    "sample": smp["index"],
                    "ids": smp["ids"],
                    "max_new_tokens": smp["sample"].max_new_tokens,
                    "eos": list(eos),
                }
                fh.write(json.dumps(job) + "\n")
    out = tmp / "results.jsonl"
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TQDM_DISABLE="1",
    )
    cmd = [str(venv_python(venv)), str(WORKER), "--gguf", str(gguf), "--jobs", str(jobs)]
    cmd += ["--out", str(out), "--threads", str(threads)]
    proc = subprocess.Popen(cmd, env=env)
    proc.out_path = out  # type: ignore[attr-defined]
    return proc


def read_kvpress(proc: subprocess.Popen) -> tuple[dict, dict, dict]:
    """(worker info, {(row, sample): record}, {row: peak RSS bytes}) once the worker is done."""
    if proc.wait() != 0:
        sys.exit(f"the kvpress worker failed (exit {proc.returncode}); see its output above.")
    info: dict = {}
    recs: dict = {}
    peaks: dict = {}
    for line in proc.out_path.read_text().splitlines():  # type: ignore[attr-defined]
        rec = json.loads(line)
        if "info" in rec:
            info = rec["info"]
        elif "peak_rss_bytes" in rec:
            peaks[(rec["row"][0], float(rec["row"][1]))] = rec["peak_rss_bytes"]
        else:
            recs[((rec["row"][0], float(rec["row"][1])), rec["sample"])] = rec
    return info, recs, peaks
