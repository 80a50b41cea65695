"""Side-by-side speed of ctxlab's engine and transformers `generate`, same model, same dtype,
same process (issue 3 "Speed"). Prints each figure and the ratio.

    .venv/bin/python benchmarks/engine_vs_hf.py            # full sizes (several minutes)
    .venv/bin/python benchmarks/engine_vs_hf.py --quick    # scaled-down sizes

Workloads: W1 (16 x ~256-token prompts, 64 output tokens, one left-padded HF batch), W2 (48
requests, prompts 64..1,024, outputs 16..256 from a fixed seed; HF in static batches of 16
that each wait for their longest output, ctxlab with continuous batching), single-request
decode tok/s, the roofline fraction of a batched decode step (peak FLOP/s and read bandwidth
measured here), bf16 vs fp32 in ctxlab (a quarter of W1), and cold/warm TTFT of a
2,000-token shared prefix. Both sides generate exactly the asked number of tokens (eos ignored
/ min_new_tokens), use the same torch threads, dtype and SDPA attention. W1/W2 also print
process CPU time, the figure that survives a shared machine (with one thread it is what the
wall time would be on an idle core); every row carries the 1-minute load average.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ctxlab.engine import LLM, SamplingParams
from ctxlab.engine.malloc import keep_heap_pages
from ctxlab.model import load_model


def hf_from_gguf(path: Path, dtype: torch.dtype):
    """transformers' own reading of the same GGUF (built by hand: no `accelerate` needed)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in parsed["tensors"].items()}, False)
    model.tie_weights()
    return model.to(dtype).eval()


def prompts_of(n: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(300, 40000) for _ in range(lengths[i])] for i in range(n)]


class Clock:
    """Wall and process CPU seconds of a block. The CPU time is the figure that survives a
    shared machine: with one torch thread it is what the wall time would be on an idle core."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


@torch.inference_mode()
def hf_batch(hf, batch: list[list[int]], n_out: int, clock: Clock | None = None) -> float:
    """One left-padded transformers generate call; returns wall seconds (CPU in `clock`)."""
    width = max(len(p) for p in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    with Clock() as c:
        hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n_out,
            min_new_tokens=n_out,
            do_sample=False,
            pad_token_id=0,
        )
    if clock is not None:
        clock.wall += c.wall
        clock.cpu += c.cpu
    return c.wall


def ours(
    llm: LLM, prompts: list[list[int]], outs: list[int], clock: Clock | None = None
) -> tuple[float, list]:
    eng = llm.engine
    with Clock() as c:
        rids = [
            eng.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True))
            for p, n in zip(prompts, outs, strict=True)
        ]
        res = eng.run_all(rids)
    if clock is not None:
        clock.wall, clock.cpu = c.wall, c.cpu
    return c.wall, res


def measure_peaks(dtype: torch.dtype) -> tuple[float, float]:
    """Matmul FLOP/s (2048^3) and read bandwidth (sum of 256 MiB), best of 5, this process."""
    a = torch.randn(2048, 2048, dtype=dtype)
    b = torch.randn(2048, 2048, dtype=dtype)
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    flops = 2 * 2048**3 / best
    x = torch.ones(64 * 2**20, dtype=torch.float32)
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return flops, x.numel() * 4 / best


def decode_step_roofline(llm: LLM, batch: int, prompt_len: int, steps: int, peaks) -> dict:
    """Time pure-decode steps of `batch` sequences; compare with the roofline bound."""
    eng = llm.engine
    prompts = prompts_of(batch, [prompt_len] * batch, seed=3)
    rids = [
        eng.add_request(p, SamplingParams(max_tokens=steps + 1, ignore_eos=True)) for p in prompts
    ]
    while any(eng.seqs[r].metrics.output_tokens == 0 for r in rids):
        eng.step()
    times = []
    for _ in range(steps - 1):
        t = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t)
    eng.run_all(rids)
    # Best step, as the peaks are best-of runs: both are "what this machine does when not
    # interrupted"; the median is printed next to it.
    step = min(times)
    median = sorted(times)[len(times) // 2]
    cfg = llm.loaded.config
    model = llm.loaded.model
    params = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    if cfg.tie_word_embeddings:
        params += cfg.vocab_size * cfg.hidden_size  # the tied lm_head is read and multiplied
    elem = next(model.parameters()).element_size()
    ctx = prompt_len + steps // 2
    attn_flops = 4 * batch * ctx * cfg.num_heads * cfg.head_dim * cfg.num_layers
    flops = 2 * params * batch + attn_flops
    kv_bytes = batch * ctx * llm.engine.kv.layout.bytes_per_token
    bytes_read = params * elem + kv_bytes
    bound = max(flops / peaks[0], bytes_read / peaks[1])
    return {"step_s": step, "median_s": median, "bound_s": bound, "fraction": bound / step}


FIGURES = ("w1", "w2", "single", "roofline", "bf16", "prefix")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="scaled-down sizes (a few minutes)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--skip-bf16", action="store_true")
    ap.add_argument(
        "--only",
        default=",".join(FIGURES),
        help=f"comma list of figures to run (default: all): {','.join(FIGURES)}",
    )
    args = ap.parse_args()
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - set(FIGURES)
    if unknown:
        ap.error(f"unknown figure(s) {', '.join(sorted(unknown))}; known: {', '.join(FIGURES)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    q = args.quick
    dtype = getattr(torch, args.dtype)
    # The engine sets this when it starts; set here first so transformers, which runs in the
    # same process, gets the same allocator behaviour from its first call.
    heap = keep_heap_pages()
    t_start = time.perf_counter()

    loaded = load_model("smollm2-135m", dtype=args.dtype)
    hf = hf_from_gguf(loaded.source_path, dtype)
    print(
        f"threads={torch.get_num_threads()} dtype={args.dtype} quick={q} "
        f"transformers attn={hf.config._attn_implementation} heap_pages_kept={heap} "
        f"cpus={os.cpu_count()} load={load()}",
        flush=True,
    )

    def llm(**kw) -> LLM:
        base = dict(kv_pool_tokens=65536, max_num_batched_tokens=4096, max_num_seqs=64)
        base.update(kw)
        return LLM(loaded, **base)

    head = ("figure", "transformers / reference", "ctxlab", "ratio", "CPU-time ratio", "goal")
    rows: list[tuple[str, ...]] = []

    def add(*row: str) -> None:
        rows.append((*row[:-1], f"{row[-1]} (load {load()})"))
        print("  ".join(rows[-1]), flush=True)

    # W1: homogeneous batch.
    n1, p1, o1 = (4, 128, 16) if q else (16, 256, 64)
    w1 = prompts_of(n1, [p1] * n1, seed=1)
    hf_batch(hf, w1[:1], 2)  # warm-up both sides
    ours(llm(), w1[:1], [2])
    if "w1" in only:
        w1_row(hf, llm, w1, n1, p1, o1, add)
    if "w2" in only:
        w2_row(hf, llm, q, add)
    if "single" in only:
        single_row(hf, llm, q, add)
    if "roofline" in only:
        roofline_row(llm, dtype, q, add)
    if "bf16" in only and not args.skip_bf16 and args.dtype == "float32":
        bf16_row(llm, w1, n1, p1, o1, add)
    if "prefix" in only:
        prefix_row(llm, q, add)

    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(s.ljust(w) for s, w in zip(r, widths, strict=True)))


def w1_row(hf, llm, w1, n1: int, p1: int, o1: int, add) -> None:
    c_hf, c_us = Clock(), Clock()
    hf_batch(hf, w1, o1, c_hf)
    e = llm()
    ours(e, w1, [o1] * n1, c_us)
    del e
    add(
        f"W1 {n1}x{p1}+{o1} wall",
        f"{c_hf.wall:.2f} s (CPU {c_hf.cpu:.2f} s)",
        f"{c_us.wall:.2f} s (CPU {c_us.cpu:.2f} s)",
        f"{c_hf.wall / c_us.wall:.2f}x",
        f"{c_hf.cpu / c_us.cpu:.2f}x",
        ">= 1.3x",
    )


def w2_row(hf, llm, q: bool, add) -> None:
    """Realistic mix; HF static batches of 16 each waiting for its longest output."""
    n2, bs2 = (12, 4) if q else (48, 16)
    rng = random.Random(42)
    plens = [rng.randint(32, 256) if q else rng.randint(64, 1024) for _ in range(n2)]
    olens = [rng.randint(8, 64) if q else rng.randint(16, 256) for _ in range(n2)]
    w2 = prompts_of(n2, plens, seed=2)
    c_hf, c_us = Clock(), Clock()
    for i in range(0, n2, bs2):
        hf_batch(hf, w2[i : i + bs2], max(olens[i : i + bs2]), c_hf)
    e = llm()
    ours(e, w2, olens, c_us)
    del e
    add(
        f"W2 {n2} mixed wall",
        f"{c_hf.wall:.2f} s (CPU {c_hf.cpu:.2f} s)",
        f"{c_us.wall:.2f} s (CPU {c_us.cpu:.2f} s)",
        f"{c_hf.wall / c_us.wall:.2f}x",
        f"{c_hf.cpu / c_us.cpu:.2f}x",
        ">= 3x",
    )


def single_row(hf, llm, q: bool, add) -> None:
    """Single request decode tokens/s (best of two runs per side)."""
    o3 = 32 if q else 64
    one = prompts_of(1, [128], seed=4)
    hf_rate = us_rate = 0.0
    for _ in range(2):
        t_full = hf_batch(hf, one, o3 + 1)
        t_first = hf_batch(hf, one, 1)
        hf_rate = max(hf_rate, o3 / max(t_full - t_first, 1e-9))
        _, res = ours(llm(kv_pool_tokens=4096), one, [o3 + 1])
        m = res[0].metrics
        us_rate = max(us_rate, o3 / (m.latency - m.ttft))
    add(
        "1 request decode",
        f"{hf_rate:.1f} tok/s",
        f"{us_rate:.1f} tok/s",
        f"{us_rate / hf_rate:.2f}x",
        "-",
        ">= 1.0x",
    )


def roofline_row(llm, dtype: torch.dtype, q: bool, add) -> None:
    """Roofline of the batched decode step."""
    peaks = measure_peaks(dtype)
    rf = decode_step_roofline(llm(), 16, 256, 8 if q else 16, peaks)
    add(
        "decode step B=16 ctx~260",
        f"peak {peaks[0] / 1e9:.0f} GFLOP/s, {peaks[1] / 1e9:.1f} GB/s",
        f"{rf['step_s'] * 1e3:.0f} ms, median {rf['median_s'] * 1e3:.0f} "
        f"(bound {rf['bound_s'] * 1e3:.0f} ms)",
        f"{rf['fraction'] * 100:.0f} %",
        "-",
        ">= 50 %",
    )


def bf16_row(llm, w1, n1: int, p1: int, o1: int, add) -> None:
    """bf16 vs fp32 in ctxlab, on a quarter of W1 (bf16 has no fast path on most CPUs)."""
    nb = max(1, n1 // 4)
    other = load_model("smollm2-135m", dtype="bfloat16")
    b = LLM(other, kv_pool_tokens=16384, max_num_batched_tokens=4096)
    ours(b, w1[:1], [2])
    t_bf, _ = ours(b, w1[:nb], [o1] * nb)
    t_fp, _ = ours(llm(kv_pool_tokens=16384), w1[:nb], [o1] * nb)
    add(
        f"ctxlab {nb}x{p1}+{o1} fp32 vs bf16",
        f"fp32 {t_fp:.2f} s",
        f"bf16 {t_bf:.2f} s",
        f"{t_fp / t_bf:.2f}x",
        "-",
        "measure",
    )


def prefix_row(llm, q: bool, add) -> None:
    """2,000-token shared prefix: cold vs warm TTFT."""
    plen = 500 if q else 2000
    prefix = prompts_of(1, [plen], seed=5)[0]
    eng = llm(kv_pool_tokens=16384)
    _, cold = ours(eng, [[*prefix, 11, 12, 13]], [1])
    _, warm = ours(eng, [[*prefix, 21, 22, 23]], [1])
    c, w = cold[0].metrics.ttft, warm[0].metrics.ttft
    add(
        f"{plen}-token shared prefix TTFT",
        f"cold {c * 1e3:.0f} ms",
        f"warm {w * 1e3:.0f} ms",
        f"{c / w:.1f}x",
        "-",
        ">= 10x",
    )


if __name__ == "__main__":
    main()
