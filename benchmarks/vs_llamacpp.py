"""ctxlab against llama.cpp on the same GGUF file, same token ids, same CPU, 1 and 2 threads.

    .venv/bin/python benchmarks/vs_llamacpp.py                       # int8, 1 and 2 threads
    .venv/bin/python benchmarks/vs_llamacpp.py --formats int8,int4,fp32 --threads 1
    .venv/bin/python benchmarks/vs_llamacpp.py --quick               # 1 rep, smaller rows
    .venv/bin/python benchmarks/vs_llamacpp.py --attention c,numba,torch --threads 1

`--attention c,numba,torch` runs each ctxlab format once per attention, side by side: with
the compiled paged decode attention (ctxlab/engine/kernels: its C or numba loops) and with
the torch reference (gather + SDPA); rows are labelled `int8 c`, `int8 numba`, `int8 torch`.

llama.cpp runs through the `xllamacpp` wheel (prebuilt llama.cpp bindings: nothing compiled,
nothing downloaded) in a worker process (`_llamacpp_worker.py`), on:
- the packaged GGUF itself (SmolLM2-135M-Instruct, Q4_1 layers, Q8_0 embedding), and
- llama.cpp at its best here: a Q4_0 copy (and with `--copies q4_0,q8_0` a Q8_0 one) of the
  same file, made once by llama.cpp's own quantizer (`ggml_quantize_chunk`, exported by the
  wheel's library and called through ctypes) from the dequantized Q4_1 layers; the Q8_0
  embedding is copied as it is. Q4_1 runs a generic path in llama.cpp; Q4_0 and Q8_0 have
  its fast kernels. Both are shown so the Q4_1 row is not read as llama.cpp's ceiling.

Rows (each ctxlab weight format against each llama.cpp file, per thread count):
- prefill of one 512- and one 2,048-token prompt (with one sampled token), tok/s;
- batch-1 decode: 128 tokens after a 512-token prompt, tok/s;
- batch-16 decode: 16 prompts of 256 tokens decoded together (llama.cpp: 16 parallel slots
  with a unified KV cache), 128 steps, tok/s over all sequences; for ctxlab also the share of
  the memory roofline (bytes its format reads per step / read bandwidth measured here).
Decode is timed over decode steps only (ctxlab: the engine's steps after every sequence has
its first token; llama.cpp: cached prompts sent twice, for 1 and for n + 1 tokens, the
difference). Every measurement is repeated `--reps` times, interleaved across engines; the
table shows best / median tok/s and ctxlab / llama.cpp ratios of the best in wall time and in
CPU time (the process's CPU seconds: immune to waiting for the core, not to sharing caches),
with the 1-minute load average at the end of each row.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from ctxlab.engine import LLM, SamplingParams
from ctxlab.engine.kernels import paged_decode
from ctxlab.model import gemv, load_model
from ctxlab.model.registry import DEFAULT_MODEL, REGISTRY, packaged_path
from ctxlab.model.weights import step_weight_bytes

GGML_TYPES = {"q4_0": 2, "q8_0": 8}


def load() -> float:
    return float(open("/proc/loadavg").read().split()[0])


# ------------------------------------------------------------------ llama.cpp's own quantizer


def quantize_copy(src: Path, qtype: str, out: Path) -> Path:
    """A copy of `src` with its Q4_1 layer matrices re-quantized by llama.cpp to `qtype`."""
    import gguf
    import xllamacpp

    dst = out / f"{src.stem}.requant-{qtype}.gguf"
    if dst.is_file():
        return dst
    lib = ctypes.CDLL(str(Path(xllamacpp.__file__).with_name("xllamacpp.abi3.so")))
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    fn.argtypes += [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    target = gguf.GGMLQuantizationType(GGML_TYPES[qtype])
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(dst) + ".part", arch=str(_field(reader, "general.architecture")))
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.name == "general.file_type":
            writer.add_uint32(f.name, {"q4_0": 2, "q8_0": 7}[qtype])
            continue
        _copy_field(writer, f)
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))  # numpy order
        if t.tensor_type == gguf.GGMLQuantizationType.Q4_1:
            values = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type))
            rows, cols = values.reshape(-1, shape[-1]).shape
            block, size = gguf.GGML_QUANT_SIZES[target]
            data = np.zeros((rows, cols // block * size), dtype=np.uint8)
            fn(int(target), values.ctypes.data, data.ctypes.data, 0, rows, cols, None)
            writer.add_tensor(t.name, data.reshape(*shape[:-1], -1), raw_dtype=target)
        else:
            raw = np.asarray(t.data)
            writer.add_tensor(t.name, raw, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    Path(str(dst) + ".part").rename(dst)
    return dst


def _field(reader, name: str):
    f = reader.fields[name]
    return f.contents()


def _copy_field(writer, f) -> None:
    import gguf

    kind = f.types[0]
    value = f.contents()
    if kind == gguf.GGUFValueType.ARRAY:
        writer.add_array(f.name, value)
    elif kind == gguf.GGUFValueType.STRING:
        writer.add_string(f.name, value)
    else:
        writer.add_key_value(f.name, value, kind)


# ------------------------------------------------------------------ the two engines


@dataclass
class Sample:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    tokens: int = 0


class LlamaCpp:
    def __init__(
        self,
        gguf: Path,
        threads: int,
        log: Path,
        poll: int | None,
        n_ctx: int = 12288,
        parallel: int = 16,
    ) -> None:
        cmd = [sys.executable, str(Path(__file__).with_name("_llamacpp_worker.py"))]
        cmd += ["--gguf", str(gguf), "--threads", str(threads), "--log", str(log)]
        cmd += ["--n-ctx", str(n_ctx), "--parallel", str(parallel)]
        if poll is not None:
            cmd += ["--poll", str(poll)]
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self._read()  # {"ready": true}

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the llama.cpp worker died; see its log")
        return json.loads(line)

    def ask(self, **job) -> dict:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def prefill(self, ids: list[int]) -> tuple[float, float]:
        r = self.ask(cmd="prefill", ids=ids)
        return r["wall"], r["cpu"]

    def decode(self, prompts: list[list[int]], n: int) -> tuple[float, float]:
        r = self.ask(cmd="decode", prompts=prompts, n=n)
        if r["cached"] < min(len(p) for p in prompts) - 1:
            print(f"  (llama.cpp reused only {r['cached']} prompt tokens)", file=sys.stderr)
        return r["wall"], r["cpu"]

    def close(self) -> None:
        self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class Ctxlab:
    def __init__(
        self, loaded, kv_pool_tokens: int = 16 * 512 + 4096, attention: str = "auto"
    ) -> None:
        self.loaded = loaded
        self.attention = attention
        self.llm = LLM(
            loaded,
            kv_pool_tokens=kv_pool_tokens,
            enable_prefix_caching=False,
            max_num_batched_tokens=4096,
        )

    def prefill(self, ids: list[int]) -> tuple[float, float]:
        paged_decode.set_enabled(self.attention)
        wall, cpu = time.perf_counter(), time.process_time()
        self.llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0))
        return time.perf_counter() - wall, time.process_time() - cpu

    def decode(self, prompts: list[list[int]], n: int) -> tuple[float, float]:
        paged_decode.set_enabled(self.attention)
        eng = self.llm.engine
        params = SamplingParams(max_tokens=n + 1, temperature=0.0, ignore_eos=True)
        rids = [eng.add_request(p, params) for p in prompts]
        while any(eng.seqs[r].metrics.output_tokens == 0 for r in rids):
            eng.step()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            eng.step()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        eng.run_all(rids)
        return wall, cpu


def linears_alone(model, m: int, reps: int = 5) -> float:
    """Seconds of one step's linear layers and head alone on M tokens (best of `reps`): the
    compute a batched step cannot avoid with this format's kernels, with no Python around."""
    from decode_profile import linears_of

    lins = [(mod, w) for mod, w in linears_of(model) if mod is not None]
    if model.output is None:  # fp32: the tied table is the head
        table = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
        lins.append((lambda x, t=table: gemv.linear(x, t), model.config.hidden_size))
    xs = {w: torch.randn(m, w) for _, w in lins}
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps):
            t = time.perf_counter()
            for mod, w in lins:
                (mod.forward if hasattr(mod, "forward") else mod)(xs[w])
            best = min(best, time.perf_counter() - t)
    return best


def read_bandwidth() -> float:
    """Bytes/s of a sum over 256 MiB, best of 5 (what one decode step can stream here)."""
    x = torch.ones(64 * 2**20)
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best


# ------------------------------------------------------------------ rows


def prompts_of(vocab: int, count: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    # ids from the ordinary part of the vocabulary (specials and control tokens come first)
    return torch.randint(1000, vocab - 1000, (count, length), generator=g).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="int8", help="ctxlab weight formats (comma list)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--copies", default="q4_0", help="llama.cpp re-quantized copies")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prefill", default="512,2048")
    parser.add_argument("--decode", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batch-prompt", type=int, default=256)
    parser.add_argument("--poll", type=int, default=None, help="llama.cpp busy-wait level")
    parser.add_argument("--out", type=Path, default=Path("/tmp/ctxlab-vs-llamacpp"))
    parser.add_argument("--quick", action="store_true", help="1 rep, 512-token prefill only")
    parser.add_argument(
        "--attention",
        default="auto",
        help="ctxlab decode attention(s), side by side: auto (the C loops where built, else "
        "numba's), c, numba, torch (the reference)",
    )
    args = parser.parse_args()
    attentions = args.attention.split(",")
    if args.quick:
        args.reps, args.prefill, args.decode = 1, "512", 32
    args.out.mkdir(parents=True, exist_ok=True)
    src = packaged_path(REGISTRY[DEFAULT_MODEL])
    files = {"Q4_1 (packaged)": src}
    for q in [c for c in args.copies.split(",") if c]:
        start = time.perf_counter()
        files[f"{q.upper()} copy"] = quantize_copy(src, q, args.out)
        print(f"{q} copy: {files[f'{q.upper()} copy']} ({time.perf_counter() - start:.1f} s)")
    weight_formats = args.formats.split(",")
    models = {f: load_model(str(src), weights=f) for f in weight_formats}
    vocab = models[weight_formats[0]].config.vocab_size
    # one ctxlab row per (format, attention): "int8", or "int8 numba" / "int8 torch"
    variants = {
        (f if len(attentions) == 1 else f"{f} {a}"): (f, a)
        for f in weight_formats
        for a in attentions
    }
    formats = list(variants)
    prefill_lens = [int(x) for x in args.prefill.split(",")]
    single = prompts_of(vocab, 1, 512, 1)
    batch = prompts_of(vocab, args.batch, args.batch_prompt, 2)
    long = {n: prompts_of(vocab, 1, n, 10 + n)[0] for n in prefill_lens}
    print(f"torch {torch.__version__}, CPU threads available {os.cpu_count()}, load {load()}")
    results: dict[tuple, Sample] = {}
    rooflines: dict[tuple, float] = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        bandwidth = read_bandwidth()
        ours = {v: Ctxlab(models[f], attention=a) for v, (f, a) in variants.items()}
        theirs = {
            name: LlamaCpp(path, threads, args.out / "llamacpp.log", args.poll)
            for name, path in files.items()
        }
        engines = {**{f"ctxlab {f}": e for f, e in ours.items()}, **theirs}
        for eng in engines.values():  # warm-up: first calls pay page faults and packing
            eng.prefill(single[0][:64])
        figures = [(f"prefill {n}", "prefill", n) for n in prefill_lens]
        figures += [("decode b=1", "decode1", args.decode)]
        figures += [(f"decode b={args.batch}", "decodeB", args.decode)]
        for label, kind, n in figures:
            for _ in range(args.reps):
                for name, eng in engines.items():
                    if kind == "prefill":
                        wall, cpu = eng.prefill(long[n])
                        tokens = n
                    elif kind == "decode1":
                        wall, cpu = eng.decode(single, n)
                        tokens = n
                    else:
                        wall, cpu = eng.decode(batch, n)
                        tokens = n * len(batch)
                    s = results.setdefault((threads, label, name), Sample())
                    s.wall.append(wall)
                    s.cpu.append(cpu)
                    s.tokens = tokens
            results[(threads, label, "load")] = Sample(wall=[load()])
            print(f"  {threads} thread(s) {label} done, load {load()}", flush=True)
        for f, e in ours.items():
            step_bytes = step_weight_bytes(e.loaded.model)
            kv = e.llm.engine.kv.layout
            ctx = args.batch_prompt + args.decode // 2
            kv_bytes = args.batch * ctx * kv.bytes_per_token
            step = min(results[(threads, f"decode b={args.batch}", f"ctxlab {f}")].wall)
            step /= args.decode
            rooflines[(threads, f)] = (step_bytes + kv_bytes) / bandwidth / step
            kernels = linears_alone(e.loaded.model, args.batch)
            print(
                f"  roofline ctxlab {f}, {threads} thread(s): {step_bytes / 2**20:.0f} MiB of "
                f"weights + {kv_bytes / 2**20:.1f} MiB of KV per step at "
                f"{bandwidth / 1e9:.1f} GB/s = {(step_bytes + kv_bytes) / bandwidth * 1e3:.1f} "
                f"ms; the format's linear kernels alone at M={args.batch}: {kernels * 1e3:.1f} "
                f"ms; measured step {step * 1e3:.1f} ms"
            )
        for eng in theirs.values():
            eng.close()
        del ours
    print_table(results, rooflines, formats, list(files), args)


def rate(s: Sample) -> tuple[float, float, float]:
    """(best tok/s, median tok/s, best tok/s in CPU time)."""
    return s.tokens / min(s.wall), s.tokens / statistics.median(s.wall), s.tokens / min(s.cpu)


def print_table(results, rooflines, formats, files, args) -> None:
    print(
        "\n| threads | figure | ctxlab | tok/s best / median (CPU) | llama.cpp file | "
        "tok/s best / median (CPU) | ctxlab / llama.cpp wall | CPU | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted(
        {(t, label) for t, label, name in results if name != "load"},
        key=lambda k: (k[0], k[1].split()[0] != "prefill", k[1]),
    )
    for threads, label in keys:
        ld = results[(threads, label, "load")].wall[0]
        for f in formats:
            mine = results[(threads, label, f"ctxlab {f}")]
            mb, mm, mc = rate(mine)
            roof = ""
            if label.startswith(f"decode b={args.batch}") and (threads, f) in rooflines:
                roof = f"; {rooflines[(threads, f)] * 100:.0f} % of roofline"
            for name in files:
                other = results[(threads, label, name)]
                ob, om, oc = rate(other)
                print(
                    f"| {threads} | {label} | {f} | {mb:.1f} / {mm:.1f} ({mc:.1f}){roof} | "
                    f"{name} | {ob:.1f} / {om:.1f} ({oc:.1f}) | {mb / ob:.2f}x | "
                    f"{mc / oc:.2f}x | {ld:.2f} |"
                )


if __name__ == "__main__":
    main()
