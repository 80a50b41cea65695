"""The kvpress side of benchmarks/vs_kvpress.py; runs with the kvpress venv's python.

    python _kvpress_worker.py --gguf MODEL.gguf --jobs jobs.jsonl --out results.jsonl

Reads one JSON object per line: {"row": [press, ratio], "sample": i, "ids": [...],
"max_new_tokens": n, "eos": [...]}; jobs of one row must be consecutive. Loads the GGUF with
transformers (no download), applies the press as a context manager around the prefill of the
whole prompt, then decodes greedily with the compressed cache at the original positions (as
kvpress's pipeline does). Writes one line per sample ({"row", "sample", "out_ids",
"kv_bytes", "kept_tokens", "seconds"}: kv_bytes is the size of the past_key_values tensors
when the answer is done) and one line per row ({"row", "peak_rss_bytes"}: the process's
peak RSS, reset before the row). Imports nothing from ctxlab: this venv has no ctxlab.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from _kvpress_env import PRESSES, peak_rss_bytes, reset_peak_rss


def cache_bytes(cache) -> tuple[int, int]:
    """(bytes of every key and value tensor held, tokens held by layer 0)."""
    total = 0
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            if t is not None:
                total += t.numel() * t.element_size()
    return total, int(cache.layers[0].keys.shape[-2])


def make_press(name: str, ratio: float):
    import kvpress

    if name == "none" or ratio == 0.0:
        return None
    return getattr(kvpress, PRESSES[name])(compression_ratio=ratio)


@torch.inference_mode()
def answer(model, press, ids: list[int], max_new_tokens: int, eos: set[int]):
    from transformers import DynamicCache

    cache = DynamicCache()
    x = torch.tensor([ids])
    if press is None:
        out = model(input_ids=x, past_key_values=cache, logits_to_keep=1)
    else:
        with press(model):
            out = model(input_ids=x, past_key_values=cache, logits_to_keep=1)
    nxt = out.logits[0, -1].argmax()
    generated = [int(nxt)]
    pos = len(ids)
    while len(generated) < max_new_tokens and generated[-1] not in eos:
        out = model(
            input_ids=nxt.view(1, 1),
            past_key_values=cache,
            position_ids=torch.tensor([[pos]]),
        )
        pos += 1
        nxt = out.logits[0, -1].argmax()
        generated.append(int(nxt))
    if generated[-1] in eos:  # like ctxlab: the eos token is not part of the answer
        generated.pop()
    kv, kept = cache_bytes(cache)
    return generated, kv, kept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--jobs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from importlib.metadata import version

    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        str(args.gguf.parent),
        gguf_file=args.gguf.name,
        dtype=torch.float32,
        attn_implementation="sdpa",
        local_files_only=True,
    ).eval()
    info = {
        "info": {
            "kvpress": version("kvpress"),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "load_seconds": round(time.perf_counter() - t0, 1),
            "rss_after_load_bytes": peak_rss_bytes(),
        }
    }
    jobs = [json.loads(line) for line in args.jobs.read_text().splitlines() if line.strip()]
    with args.out.open("w") as fh:
        fh.write(json.dumps(info) + "\n")
        fh.flush()
        row = None
        for job in [*jobs, None]:
            key = None if job is None else tuple(job["row"])
            if key != row:
                if row is not None:
                    fh.write(json.dumps({"row": list(row), "peak_rss_bytes": peak_rss_bytes()}))
                    fh.write("\n")
                    fh.flush()
                if job is None:
                    break
                row = key
                press = make_press(row[0], float(row[1]))
                # ObservedAttention needs the attention matrix: eager attention (kvpress says so).
                eager = row[0] == "observed_attention" and press is not None
                model.set_attn_implementation("eager" if eager else "sdpa")
                reset_peak_rss()
            t = time.perf_counter()
            out_ids, kv, kept = answer(
                model, press, job["ids"], job["max_new_tokens"], set(job["eos"])
            )
            rec = {
                "row": list(row),
                "sample": job["sample"],
                "out_ids": out_ids,
                "kv_bytes": kv,
                "kept_tokens": kept,
                "seconds": round(time.perf_counter() - t, 2),
            }
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            print(
                f"kvpress {row[0]} {row[1]} sample {job['sample']}: {rec['seconds']} s",
                file=sys.stderr,
            )


if __name__ == "__main__":
    main()
