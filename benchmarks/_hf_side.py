"""The ctxlab.hf side of benchmarks/vs_kvpress.py: the same policy objects on transformers.

Runs in the main venv (transformers 5.x), in the benchmark's own process: transformers reads
the GGUF itself, and each row's policy drives a `ctxlab.hf` cache.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

from _kvpress_env import peak_rss_bytes, reset_peak_rss

BASELINE = ("none", 0.0)
PAIRS = {
    "snapkv": "snapkv",
    "streaming": "streaming",
    "observed_attention": "h2o",
    "knorm": "knorm",
}


def load_hf(gguf: Path):
    """transformers' own reading of the same GGUF (`ctxlab.hf.from_gguf`)."""
    from ctxlab.hf import from_gguf

    return from_gguf(str(gguf))[0]


def run_hf(model, rows, policy_of, samples: list[dict], eos, page: int) -> tuple[dict, dict, dict]:
    """The same rows through `ctxlab.hf` on transformers' model in this process: the same
    policy objects as the engine rows, driving a transformers cache (greedy, decoded one
    token at a time at the original positions, as the kvpress worker does). `policy_of(row)`
    is the row's (policy name, budget)."""
    import torch

    import ctxlab.hf

    recs: dict = {}
    peaks: dict = {}
    import transformers

    info = {"transformers": transformers.__version__, "page": page}
    for row in rows:
        gc.collect()
        reset_peak_rss()
        name, budget = policy_of(row)
        for smp in samples:
            t = time.perf_counter()
            cache = ctxlab.hf.cache(model, name, budget, page=page)
            with torch.inference_mode():
                out = model(input_ids=torch.tensor([smp["ids"]]), cache=cache, logits_to_keep=1)
                generated = [int(out.logits[0, -1].argmax())]
                while len(generated) < smp["sample"].max_new_tokens and generated[-1] not in eos:
                    x = torch.tensor([[generated[-1]]])
                    out = model(input_ids=x, cache=cache, logits_to_keep=1)
                    generated.append(int(out.logits[0, -1].argmax()))
            if generated[-1] in eos:
                generated.pop()
            secs = time.perf_counter() - t
            recs[(row, smp["index"])] = {
                "out_ids": generated,
                "kv_bytes": cache.resident_bytes(),
                "seconds": round(secs, 2),
            }
            print(f"ctxlab.hf {name} {budget} sample {smp['index']}: {secs:.2f} s", file=sys.stderr)
        peaks[row] = peak_rss_bytes()
    return info, recs, peaks
