"""The llama.cpp side of benchmarks/vs_llamacpp.py: one xllamacpp server in its own process.

    python _llamacpp_worker.py --gguf FILE --threads N --log FILE      (JSON lines on stdin)

A separate process so that llama.cpp keeps its own OpenMP settings (ctxlab sets
OMP_WAIT_POLICY=PASSIVE for torch; llama.cpp's threads would inherit it) and so its CPU
time is its own. Commands, one JSON object per line; every answer is one JSON line:
- {"cmd": "prefill", "ids": [...]} -> {"wall", "cpu"}: the prompt with one sampled token,
  without the prompt cache.
- {"cmd": "decode", "prompts": [[...], ...], "n": 128} -> {"wall", "cpu", "tokens",
  "llama_decode_s"}: the prompts are cached first (one sampled token each), then sent again
  concurrently twice, asking for 1 and for n + 1 tokens; the difference of the two is the
  time of n decode steps for every prompt, in wall and CPU time.
- {"cmd": "quit"}.
CPU time is this process's (llama.cpp's threads included). llama.cpp's log goes to --log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def quiet_stderr(path: str) -> None:
    """llama.cpp logs every request on stderr; send the file descriptor to a log file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)


def make_server(args):
    import xllamacpp as x

    p = x.CommonParams()
    p.model.path = args.gguf
    p.n_ctx = args.n_ctx
    p.n_parallel = args.parallel
    p.kv_unified = True  # one KV buffer for all slots: one request may use all of n_ctx
    p.n_batch = 2048
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    if args.poll is not None:
        p.cpuparams.poll = args.poll
        p.cpuparams_batch.poll = args.poll
    p.warmup = True
    return x.Server(p)


def complete(server, ids: list[int], n: int, cache: bool) -> dict:
    return server.handle_completions(
        {
            "prompt": ids,
            "n_predict": n,
            "temperature": 0.0,
            "ignore_eos": True,
            "cache_prompt": cache,
        }
    )


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def run_all(server, prompts: list[list[int]], n: int) -> list[dict]:
    if len(prompts) == 1:
        return [complete(server, prompts[0], n, True)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda ids: complete(server, ids, n, True), prompts))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--poll", type=int, default=None)
    parser.add_argument("--log", default=os.devnull)
    args = parser.parse_args()
    quiet_stderr(args.log)
    server = make_server(args)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        if job["cmd"] == "quit":
            break
        if job["cmd"] == "prefill":
            _, wall, cpu = timed(lambda job=job: complete(server, job["ids"], 1, False))
            answer = {"wall": wall, "cpu": cpu}
        elif job["cmd"] == "decode":
            prompts, n = job["prompts"], job["n"]
            run_all(server, prompts, 1)  # fill each slot's prompt cache
            _, wall_a, cpu_a = timed(lambda p=prompts: run_all(server, p, 1))
            outs, wall_b, cpu_b = timed(lambda p=prompts, n=n: run_all(server, p, n + 1))
            answer = {
                "wall": wall_b - wall_a,
                "cpu": cpu_b - cpu_a,
                "tokens": n * len(prompts),
                "llama_decode_s": max(o["timings"]["predicted_ms"] for o in outs) / 1e3,
                "cached": min(o["timings"]["cache_n"] for o in outs),
            }
        else:
            answer = {"error": f"unknown command {job['cmd']!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
