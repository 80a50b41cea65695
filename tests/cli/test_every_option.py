"""Every documented option of every command, run once on valid input, in this process.

A command's body imports most of what it uses inside itself (so `ctxlab --help` stays fast),
so a function that moved to another module breaks only the run that reaches that import:
`generate --offload-bytes` shipped an ImportError that way (issue 33). `ROWS` is one line per
run; `test_every_documented_option_has_a_row` walks the click tree from `ctxlab.cli` and
fails, naming the command and the option, when an option that `--help` shows is run by no
row. Adding an option is adding (or extending) a row here.

Runs are tiny (one or two tokens, a few requests, tiny sizes). Where a command would run
until interrupted or for minutes, one seam stands in, named in `SEAMS` with the reason: the
option is still parsed, checked and carried into the objects the command builds.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shlex
import socket
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.conftest import Result, run_in_process

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODEL = "smollm2-135m"


@dataclass(frozen=True)
class Row:
    """`ctxlab ARGV` (shell words; `{name}` is a path or URL from the `places` fixture) must
    exit with `code` and print `expect` on stdout; `seam` names an entry of SEAMS."""

    argv: str
    expect: str = ""
    seam: str | None = None
    code: int = 0
    broken: str | None = None  # a known bug this row shows: a strict xfail, until fixed


ROWS: tuple[Row, ...] = (
    # plan: no model, no torch
    Row(
        "plan llama-3.1-8b -c 4K,32K -n 4 --page-size 32 --device h200 --gpus 1 "
        "--cache-dtype fp8 --shared-prefix 1024 --output-tokens 64 --weights-bytes 16GiB "
        "--reserve-bytes 4GiB --price-input 3 --price-output 15 --price-cache-write 3.75 "
        "--price-cache-read 0.3 --price-unit 1000000 --currency EUR --gpu-hourly 2 "
        "--cpu-hourly 0.1 --gpu-seconds 2 --cpu-seconds 1 --successes 2 --plot {tmp}/kv.png",
        "EUR",
    ),
    Row("plan --config {hf_config} --block-size 16 --json", '"max_concurrent_requests"'),
    Row(
        "plan llama-3.1-8b -c 8K --rate-card default --gpu-hourly 2 --failed 1 --cancelled 1 "
        "--network-bytes 1GB --storage-byte-seconds 1e12 --idle-reserve 0.1 --json",
        '"self_hosted_cost_terms"',
    ),
    Row(
        "plan --gguf {gguf} --device custom --device-flops 1e14 --device-bandwidth 1e12 "
        "--device-memory 24GiB -c 2048",
        "custom",
    ),
    Row(
        "plan llama-3.1-8b -c 4K --engine vllm --platform cpu --kv-cache-bytes 1GiB "
        "--gpu-memory-utilization 0.9 --activation-bytes 1GiB --max-model-len 8K "
        "--max-num-batched-tokens 2048 --disable-hybrid-kv-cache-manager",
        "vllm",
    ),
    Row("plan llama-3.1-8b -c 4K --engine llamacpp --slots 2", "llama"),
    Row("plan --list", "llama-3.1-8b"),
    Row("policies --json", "snapkv"),
    # simulate: no model, except --calibrate
    Row(
        "simulate synthetic:n=12,groups=2,prefix=256,rate=4,seed=1 llama-3.1-8b --device h200 "
        "--gpus 1 --weights-bytes 16GiB --reserve-bytes 4GiB --page-size 32 --chunk-tokens 512 "
        "--max-running 8 --pool-bytes 2GiB --offload-bytes 8GiB --offload-bandwidth 2e10 "
        "--offload-latency 0.001 --slo-ttft 1 --slo-tpot 0.05 --compute-efficiency 0.4 "
        "--memory-efficiency 0.7 --step-overhead 0.001 --step-scale 1.05 --seed 1 "
        "--trace-time-scale 0.5 --out {tmp}",
        "TTFT",
    ),
    Row(
        "simulate synthetic:n=12,rate=4,seed=1 llama-3.1-8b --sweep trace-time-scale=2,0.5 "
        "--slo-attainment 0.8 --out {tmp}",
        "SLO",
    ),
    Row(
        "simulate {trace} --config {hf_config} --device custom --device-flops 1e14 "
        "--device-bandwidth 1e12 --device-memory 24GiB --hash-block 16 --unlimited-cache "
        "--json --out {tmp}",
        '"ttft',
    ),
    Row(
        "simulate synthetic:n=8,rate=2,seed=1 --gguf {gguf} --disaggregated --prefill-gpus 1 "
        "--kv-transfer-bandwidth 1e10 --sweep chunk-tokens=256,512 --out {tmp}",
    ),
    Row("simulate synthetic:n=6,rate=2,seed=1 --gguf {gguf} --profile {profile} --out {tmp}"),
    Row(
        "simulate --calibrate --requests 2 --rate 4 --model smollm2-135m --threads 1 --seed 2 "
        "--profile {profile} --out {tmp}/cal",
    ),
    # generate
    Row(
        "generate 'The capital of France is' --max-tokens 2 --temperature 0.7 --top-p 0.9 "
        "--top-k 20 --seed 3 --kv-pool-tokens 512 --page-size 8 --threads 1 --policy snapkv "
        "--budget 64 --weights int8 --model smollm2-135m",
        "prompt",
    ),
    Row("generate --chat --file {prompt_file} --max-tokens 1 --kv-format int8 --json", '"text"'),
    Row(
        "generate 'The capital of France is' --max-tokens 2 --kv-cache-dtype bfloat16 --json",
        '"kv_cache_dtype": "bfloat16"',
    ),
    Row("generate 'The capital of France is' --max-tokens 2 --offload-bytes 64MiB", "offload"),
    Row(
        "generate 'The capital of France is' --max-tokens 2 --offload-bytes 0 "
        "--offload-dir {tmp}/tier",
        "offload",
    ),
    Row("generate Hello --max-tokens 1 --no-prefix-cache --block-size 16", "prompt"),
    Row("generate Hello --max-tokens 1 --rope-scaling yarn:2 --json", '"text"'),
    Row("--version", "ctxlab "),
    # eval
    Row(
        "eval --tasks niah_single_noise --lengths 256 --depths 1 --samples 1 --seed 1 "
        "--policy snapkv --budget 0.5 --threshold 80 --model smollm2-135m --out {tmp} "
        "--rope-scaling dynamic:2 --json",
        '"effective_length"',
    ),
    Row(
        "eval --suite quick --tasks niah_single_noise --lengths 256 --depths 1 --samples 1 "
        "--relative-threshold 0.9 --backend openai --base-url {url} --api-key k --timeout 120 "
        "--out {tmp}",
    ),
    Row(
        "eval perplexity --tokens 96 --cache 48 --chunk 32 --segment 32 --model smollm2-135m "
        "--threads 1 --out {tmp} --json",
        '"curve_ppl"',
    ),
    Row(
        "eval lost-in-middle --documents 2 --samples 1 --seed 1 --model smollm2-135m "
        "--policy full,snapkv --budget 0.5 --threads 1 --out {tmp} --json",
        '"snapkv@0.5"',
    ),
    Row(
        "eval attention --tokens 32 --prompts 2 --queries 2 --sinks 2 --model smollm2-135m "
        "--threads 1 --plot {tmp}/attention.png --json",
        '"by_kind"',
    ),
    Row("eval attention --tokens 24 --prompts 1 --queries 1", "first k tokens"),
    Row("eval summarize {eval_rows} --threshold 80 --compact"),
    Row("eval summarize {eval_rows} --relative-threshold 0.9 --json", '"effective'),
    # memory
    Row("memory fixture --out {tmp}/fixture --seed 2"),
    Row("memory import {memory}/history.jsonl --db {tmp}/m.db --agent ann"),
    Row(
        "memory core --set persona=terse --limit 100 --read-only --db {tmp}/m.db --agent ann "
        "--json",
        "persona",
    ),
    Row(
        "memory search 'where do I live' --db {memory_db} --tier recall --k 2 "
        "--retriever bm25 --role user --since 2000-01-01 --until 2100-01-01 --agent default",
    ),
    Row("memory search lunch --db {memory_db} --tier archival --tag note --json"),
    Row("memory strategies --json", "truncation"),
    Row("memory tools", "archival"),
    Row(
        "memory compact --history {memory}/short.jsonl --facts {memory}/short-facts.json "
        "--strategy truncation --window 512 --reserve 32 --warn 0.7 --compact-at 0.85 --k 2 "
        "--note-position turn --retriever bm25 --answer-tokens 2 --seed 1 --model smollm2-135m "
        "--dtype float32 --threads 1 --out {tmp} --json",
    ),
    Row(
        "memory compact --history {memory}/short.jsonl --facts {memory}/short-facts.json "
        "--strategy truncation --window 512 --answer-tokens 2 --backend openai "
        "--base-url {url}/v1 --served-model smollm2-135m --api-key k --tokenizer smollm2-135m "
        "--timeout 120 --out {tmp}",
    ),
    # rag
    Row("rag fixture --out {tmp}/fixture --seed 2"),
    Row(
        "rag ingest {rag}/docs --db {tmp}/r.db --chunk-tokens 48 --overlap-tokens 4 "
        "--model smollm2-135m --json",
    ),
    Row("rag docs --db {rag_db} --json"),
    Row(
        "rag ask 'What is the refund window?' --k 2 --retriever hybrid --order edges "
        "--metadata always --as-of 2100-01-01 --max-tokens 2 --db {rag_db} "
        "--model smollm2-135m --dtype float32 --threads 1 --json",
    ),
    Row(
        "rag ask 'What is the refund window?' --max-tokens 2 --db {rag_db} --backend openai "
        "--base-url {url}/v1 --served-model smollm2-135m --api-key k --tokenizer smollm2-135m "
        "--timeout 120",
    ),
    Row(
        "rag eval --limit 1 --k 1,2 --retriever bm25 --answer-k 1 --answer-retriever bm25 "
        "--closed-book --order edges --metadata never --answer-tokens 2 --cost-samples 1 "
        "--price-input 0.2 --price-output 0.5 --seed 0 --db {rag_db} --model smollm2-135m "
        "--dtype float32 --threads 1 --out {tmp}/o --json",
    ),
    Row(
        "rag eval {rag}/docs --questions {rag}/questions.jsonl --no-answers --limit 2 "
        "--chunk-tokens 48 --overlap-tokens 4 "
        "--backend openai --base-url {url}/v1 --served-model smollm2-135m --api-key k "
        "--tokenizer smollm2-135m --timeout 120 --out {tmp}",
    ),
    # the engine's steps and a server's
    Row(
        "profile --quick --model smollm2-135m --out {tmp}/p.json --threads 1 --dtype float32 "
        "--kv-pool-tokens 1024 --block-size 16 --max-num-batched-tokens 256 --max-num-seqs 4 "
        "--seed 1 --json",
        seam="tiny profile design",
    ),
    Row(
        "serve --model smollm2-135m --host 127.0.0.1 --port 0 --served-model-name tiny "
        "--policy snapkv --budget 64 --kv-pool-tokens 1024 --page-size 8 --weights fp32 "
        "--max-num-seqs 2 --max-num-batched-tokens 256 --max-model-len 512 --max-waiting 4 "
        "--request-timeout 60 --api-keys {api_keys} --metrics-prefix vllm --threads 1 "
        "--log-level error --step-log {tmp}/steps.jsonl --decode-cpu {cpu} "
        "--kv-cache-dtype bfloat16",
        "ready http://127.0.0.1:",
        seam="uvicorn",
    ),
    Row(
        "serve --port 0 --kv-format int8 --no-prefix-cache --block-size 16 --rope-scaling linear:2",
        "ready http://127.0.0.1:",
        seam="uvicorn",
    ),
    Row(
        "serve --port 0 --offload-bytes 64MiB --offload-dir {tmp}/tier "
        "--kv-events-endpoint tcp://127.0.0.1:{port_a} "
        "--kv-events-replay-endpoint tcp://127.0.0.1:{port_b}",
        "ready http://127.0.0.1:",
        seam="uvicorn",
    ),
    Row("serve --port 0 --disaggregated --prefill-cpu {cpu}", "ready http://", seam="two roles"),
    Row("serve --role prefill --kv-socket {tmp}/kv.sock", "ready kv", seam="two roles"),
    Row("serve --port 0 --role decode --kv-socket {tmp}/kv.sock", "ready http", seam="two roles"),
    Row(
        "bench serve --base-url {url} --model smollm2-135m --endpoint /v1/chat/completions "
        "--dataset random --num-prompts 2 --input-len 8 --output-len 1 --range-ratio 0.5 "
        "--request-rate 50 --burstiness 2 --max-concurrency 2 --ignore-eos "
        "--metric-percentiles 50,99 --percentile-metrics ttft,e2el --goodput ttft:5000 "
        "--api-key k --timeout 60 --seed 1 --out {tmp} --json",
        '"completed"',
    ),
    Row(
        "bench serve --base-url {url} --model smollm2-135m --dataset shared-prefix "
        "--num-prompts 2 --prefix-len 16 --num-prefixes 1 --input-len 4 --output-len 1 "
        "--out {tmp}",
    ),
    Row(
        "bench serve --base-url {url} --model smollm2-135m --dataset multi-turn --num-prompts 1 "
        "--turns 2 --input-len 4 --output-len 1 --out {tmp}",
    ),
    Row(
        "bench serve --base-url {url} --model smollm2-135m --dataset trace --trace {trace} "
        "--trace-hash-block 16 --trace-time-scale 0.01 --output-len 1 --out {tmp}",
    ),
    Row(
        "probe --server {url} --api-key k --model smollm2-135m --out {tmp}/probe.json "
        "--sections prefix --max-requests 6 --max-tokens 4000 --max-seconds 60 --longest 32 "
        "--arch smollm2-135m --kv-events tcp://127.0.0.1:{port_a} --yes --json",
        '"sections"',
    ),
    Row(
        "probe --server {url} --out {tmp}/probe.json --sections profile --max-requests 4 "
        "--max-seconds 60 --full --yes",
    ),
    # no publisher listens there: every option is read and residency.json written, and the
    # run ends in the one sentence that says no event arrived (exit 2)
    Row(
        "watch tcp://127.0.0.1:{port_a} --seconds 0.3 --out {tmp} "
        "--replay tcp://127.0.0.1:{port_b} --topic '' --requests {watch_requests} "
        "--max-events 100 --json",
        '"shorter than one block"',
        code=2,
    ),
    Row("export-hf smollm2-135m --out {tmp}/hf --force --json", '"folder"', seam="hf export"),
    # the lab, the tour, the workshop
    Row("lab --port 0 --host 127.0.0.1", "serving on http://127.0.0.1:", seam="lab page"),
    Row("tour --out {tmp} --no-model", "output folder"),
    Row("workshop --print-config", "[prefix_miss]"),
    Row("workshop {workshop_toml} --full --only 1 --out {tmp} --json", '"status"'),
    Row(
        "workshop {workshop_toml} --quick --only 1 --out {tmp} --server {url} --api-key k "
        "--server-model smollm2-135m --server-timeout 120",
    ),
)


# --- the coverage check ------------------------------------------------------------------


@functools.cache
def _commands() -> dict[tuple[str, ...], object]:
    """Every command of `ctxlab` by its words (`("rag", "ask")`; `()` is `ctxlab` itself): the
    leaves, and each group too, whose own options (`ctxlab eval --tasks`) count as well."""
    import typer

    from ctxlab.cli import app

    out: dict[tuple[str, ...], object] = {}

    def walk(cmd: object, path: tuple[str, ...]) -> None:
        out[path] = cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return out


def _documented(cmd: object) -> dict[str, str]:
    """Each option `--help` shows (hidden ones and --help aside): every spelling -> its
    first spelling, the name a missing row is reported by."""
    names: dict[str, str] = {}
    for param in getattr(cmd, "params", []):
        opts = [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
        if getattr(param, "param_type_name", "") != "option" or getattr(param, "hidden", False):
            continue
        long = next((o for o in opts if o.startswith("--")), opts[0])
        names.update({o: long for o in opts})
    names.pop("--help", None)
    return names


def _split(row: Row) -> tuple[tuple[str, ...], list[str]]:
    """A row's command words and the rest of its words."""
    words = shlex.split(row.argv)
    commands = _commands()
    for n in range(len(words), -1, -1):
        if tuple(words[:n]) in commands:
            return tuple(words[:n]), words[n:]
    raise AssertionError(f"row {row.argv!r} names no ctxlab command")


def test_every_documented_option_has_a_row() -> None:
    covered: dict[tuple[str, ...], set[str]] = {}
    for row in ROWS:
        path, rest = _split(row)
        documented = _documented(_commands()[path])
        unknown = [w.split("=")[0] for w in rest if w.startswith("-") and len(w) > 1]
        unknown = [w for w in unknown if w not in documented and not w[1:2].isdigit()]
        assert not unknown, f"row {row.argv!r}: {unknown} are not options of ctxlab {path}"
        covered.setdefault(path, set()).update(
            documented[w.split("=")[0]] for w in rest if w.split("=")[0] in documented
        )
    missing = []
    for path, cmd in sorted(_commands().items()):
        shown = set(_documented(cmd).values())
        if path not in covered and (shown or not getattr(cmd, "commands", None)):
            missing.append(f"ctxlab {' '.join(path)} (no row at all)")
            continue
        missing += [
            f"ctxlab {' '.join(path)} {opt}" for opt in sorted(shown - covered.get(path, set()))
        ]
    assert not missing, (
        "options no row of ROWS in tests/cli/test_every_option.py runs (add them to a row "
        "that runs on valid input): " + "; ".join(missing)
    )


def test_rows_name_only_seams_that_exist() -> None:
    assert {row.seam for row in ROWS} - {None} <= set(SEAMS)


# --- what the rows need ------------------------------------------------------------------


def _quiet_main(*args: str) -> None:
    """`ctxlab ARGS` in this process for a fixture, its output dropped; it must succeed."""
    from ctxlab.cli import main

    with (
        pytest.MonkeyPatch.context() as mp,
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()) as err,
    ):
        mp.setattr(sys, "argv", ["ctxlab", *args])
        with pytest.raises(SystemExit) as exc:
            main()
    assert exc.value.code == 0, err.getvalue()


@pytest.fixture(scope="module")
def served_url() -> Iterator[str]:
    """`ctxlab serve`'s app on the default model, in a thread, on a free loopback port (for
    the rows that name `{url}`)."""
    from ctxlab.engine import LLM
    from ctxlab.serve import ServeSettings, create_app
    from ctxlab.serve.server import start_in_thread

    llm = LLM(model=MODEL, kv_pool_tokens=4096, max_num_seqs=4, max_num_batched_tokens=512)
    server, url = start_in_thread(create_app(llm.engine, ServeSettings(MODEL)))
    try:
        yield url
    finally:
        server.should_exit = True
        server.thread.join(timeout=30)


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory, gguf_path: Path) -> dict[str, str]:
    """The files and the server the rows name, made once for the module."""
    tmp = tmp_path_factory.mktemp("every_option")
    memory, rag = tmp / "memory", tmp / "rag"
    _quiet_main("memory", "fixture", "--out", str(memory))
    _quiet_main("memory", "import", str(memory / "history.jsonl"), "--db", str(tmp / "m.db"))
    _first_fact(memory)
    _quiet_main("rag", "fixture", "--out", str(rag))
    _quiet_main("rag", "ingest", str(rag / "docs"), "--db", str(tmp / "r.db"))
    hf_config = tmp / "config.json"
    hf_config.write_text(json.dumps(SMOLLM2_CONFIG))
    trace = tmp / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": 100 * i,
                    "input_length": 24,
                    "output_length": 1,
                    "hash_ids": [0, 1 + i],
                }
            )
            + "\n"
            for i in range(3)
        )
    )
    prompt = tmp / "prompt.txt"
    prompt.write_text("Name one colour.")
    keys = tmp / "keys.toml"
    keys.write_text('[keys]\n"key-of-tenant-a" = "tenant-a"\n')
    workshop = tmp / "workshop.toml"
    workshop.write_text(WORKSHOP_TOML)
    rows = tmp / "eval" / "rows.jsonl"
    rows.parent.mkdir()
    rows.write_text("".join(json.dumps(r) + "\n" for r in _eval_rows()))
    profile = tmp / "profile.json"
    profile.write_text(json.dumps({"format": "ctxlab-step-profile/1", "steps": _steps()}))
    cpu = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    watch = tmp / "requests.jsonl"
    watch.write_text(json.dumps({"at": 1.7e9, "token_ids": list(range(1, 18)), "salt": None}))
    return {
        "gguf": str(gguf_path), "hf_config": str(hf_config), "trace": str(trace),
        "prompt_file": str(prompt), "api_keys": str(keys), "workshop_toml": str(workshop),
        "eval_rows": str(rows), "profile": str(profile), "memory": str(memory),
        "memory_db": str(tmp / "m.db"), "rag": str(rag), "rag_db": str(tmp / "r.db"),
        "cpu": str(cpu), "watch_requests": str(watch), "port_a": _free_port(),
        "port_b": _free_port(),
    }  # fmt: skip


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _first_fact(memory: Path) -> None:
    """short.jsonl and short-facts.json: the fixture's first messages and the one planted
    fact among them (`memory compact` answers every fact: ten take a minute here)."""
    lines = (memory / "history.jsonl").read_text().splitlines()[:14]
    (memory / "short.jsonl").write_text("\n".join(lines) + "\n")
    facts = json.loads((memory / "facts.json").read_text())
    kept = [f for f in facts if f["message"] < 14 and all(m < 14 for m in f["superseded"])]
    (memory / "short-facts.json").write_text(json.dumps(kept[:1]))


SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "num_hidden_layers": 30,
    "max_position_embeddings": 8192,
    "vocab_size": 49152,
    "torch_dtype": "bfloat16",
}

# Demonstration 1 at a size that runs in seconds (the embedded default fills in the rest).
WORKSHOP_TOML = """\
[prefix_miss]
prompt_tokens = 64
output_tokens = 1
repeats = 1

[quick.prefix_miss]
prompt_tokens = 48
output_tokens = 1
repeats = 1
"""


def _eval_rows() -> list[dict[str, object]]:
    return [
        {"task": "niah_single_noise", "policy": policy, "budget": budget, "length": length,
         "depth": depth, "score": 100.0 if policy == "full" or length == 512 else 60.0,
         "resident_kv_bytes": length * (2048 if policy == "full" else 512)}
        for policy, budget in (("full", None), ("snapkv", 256))
        for length in (512, 1024)
        for depth in (0.0, 1.0)
    ]  # fmt: skip


def _steps() -> list[dict[str, float]]:
    """A step profile on an exact linear law (as tests/sim/test_calibrate_sim.py's)."""
    steps = []
    for pt, dt, ctx in [(0, 1, 100), (0, 4, 300), (64, 0, 0), (256, 0, 0), (128, 2, 50),
                        (0, 8, 700), (512, 3, 200), (32, 5, 900)]:  # fmt: skip
        steps.append(
            {"prefill_tokens": pt, "prefill_keys": pt * (pt + 1) // 2, "decode_tokens": dt,
             "decode_keys": dt * ctx, "seconds": 0.02 + 0.0005 * pt + 0.005 * dt}
        )  # fmt: skip
    return steps


# --- seams: where a command would run until interrupted, or for minutes -------------------


def _uvicorn(mp: pytest.MonkeyPatch, seen: dict[str, object]) -> None:
    """`serve` runs uvicorn until Ctrl-C: here the app it built answers one completion on the
    socket it bound, then the server stops."""
    import ctxlab.serve.server as server_mod

    def serve_once(app, sock, log_level="warning", on_ready=None) -> None:
        server = server_mod._server(app, log_level)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            while not server.started and thread.is_alive():
                thread.join(0.02)
            url = server_mod.url_of(sock)
            if on_ready is not None:
                on_ready(url)
            auth = {"Authorization": "Bearer key-of-tenant-a", "Content-Type": "application/json"}
            req = urllib.request.Request(f"{url}/v1/models", headers=auth)
            with urllib.request.urlopen(req, timeout=60) as resp:
                name = json.loads(resp.read())["data"][0]["id"]
            body = json.dumps({"model": name, "prompt": "Hi", "max_tokens": 1}).encode()
            req = urllib.request.Request(f"{url}/v1/completions", body, auth)
            with urllib.request.urlopen(req, timeout=120) as resp:
                seen["completion"] = json.loads(resp.read())
        finally:
            server.should_exit = True
            thread.join(timeout=30)

    mp.setattr(server_mod, "serve", serve_once)
    # --decode-cpu pins the serving process to one core: not this test process
    mp.setattr(os, "sched_setaffinity", lambda pid, cpus: seen.update(pinned=cpus))


def _two_roles(mp: pytest.MonkeyPatch, seen: dict[str, object]) -> None:
    """`--disaggregated` and `--role` run two processes that meet on a socket (that link is
    tests/serve/test_disagg.py's): here the prefill child is not started, the decode side
    gets the local engine, a prefill worker returns at once, and pinning is recorded."""
    from ctxlab.commands import _serve_roles
    from ctxlab.serve import disagg_prefill

    _uvicorn(mp, seen)
    mp.setattr(_serve_roles.Roles, "start_prefill", lambda self, args: seen.update(child=args))

    def connect(self, engine, model_id: str):
        engine.attach_metrics = lambda *args: seen.update(metrics=args)
        return engine

    mp.setattr(_serve_roles.Roles, "connect", connect)

    def serve_forever(self, on_ready=None) -> None:
        if on_ready is not None:
            on_ready()

    mp.setattr(disagg_prefill.PrefillWorker, "serve_forever", serve_forever)


def _lab_page(mp: pytest.MonkeyPatch, seen: dict[str, object]) -> None:
    """`lab` serves until Ctrl-C: here the page is fetched once, then the server stops."""
    import ctxlab.lab.server as lab_server

    made = lab_server.make_server

    def make_server(host: str, port: int):
        server = made(host, port)
        forever = server.serve_forever

        def once() -> None:
            thread = threading.Thread(target=forever, daemon=True)
            thread.start()
            try:
                url = lab_server.server_url(server)
                with urllib.request.urlopen(url, timeout=60) as resp:
                    seen["page"] = resp.read()
            finally:
                server.shutdown()
                thread.join(timeout=30)

        server.serve_forever = once
        return server

    mp.setattr(lab_server, "make_server", make_server)


def _tiny_profile(mp: pytest.MonkeyPatch, seen: dict[str, object]) -> None:
    """`profile --quick` times about a hundred engine steps (a minute here): here it times a
    handful, through the same code."""
    from ctxlab.engine import profile

    tiny = profile.Design(
        prefill=((32, 2), (64, 1)), decode_contexts=(32,), decode_batches=(1, 2),
        decode_steps=1, mixed_batch=(2,), mixed_context=32, mixed_prompts=(32,),
    )  # fmt: skip
    mp.setattr(profile, "QUICK", tiny)
    mp.setattr(profile, "FULL", tiny)


def _hf_export(mp: pytest.MonkeyPatch, seen: dict[str, object]) -> None:
    """`export-hf` writes 540 MB of float32 weights through transformers (tests/hf/
    test_export.py runs a real export): here the export records what reached it."""
    from ctxlab.hf import export

    def export_folder(model: str, folder: Path | None = None, force: bool = False) -> Path:
        seen["export"] = (model, folder, force)
        return Path(str(folder))

    mp.setattr(export, "export_folder", export_folder)


SEAMS: dict[str, Callable[[pytest.MonkeyPatch, dict[str, object]], None]] = {
    "uvicorn": _uvicorn,
    "two roles": _two_roles,
    "lab page": _lab_page,
    "tiny profile design": _tiny_profile,
    "hf export": _hf_export,
}


# --- the runs ----------------------------------------------------------------------------


@pytest.fixture
def restored() -> Iterator[None]:
    """A run may set torch's threads (--threads) or seed; both come back afterwards."""
    import torch

    threads, state = torch.get_num_threads(), torch.random.get_rng_state()
    yield
    torch.set_num_threads(threads)
    torch.random.set_rng_state(state)


@pytest.mark.model
@pytest.mark.parametrize(
    "row",
    [
        pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=r.broken)) if r.broken else r
        for r in ROWS
    ],
    ids=[r.argv[:60] for r in ROWS],
)
def test_row_runs(row: Row, places, request, tmp_path, monkeypatch, capsys, restored) -> None:
    seen: dict[str, object] = {}
    if row.seam is not None:
        SEAMS[row.seam](monkeypatch, seen)
    monkeypatch.chdir(tmp_path)
    if "{url}" in row.argv:
        places = {**places, "url": request.getfixturevalue("served_url")}
    words = [w.format(tmp=tmp_path, **places) for w in shlex.split(row.argv)]
    result: Result = run_in_process(monkeypatch, capsys, *words)
    assert result.code == row.code, result.err[-3000:]
    assert "Traceback" not in result.err
    assert row.expect in result.out, result.out[-3000:]
    if row.seam in ("uvicorn", "two roles") and "--role prefill" not in row.argv:
        assert seen["completion"]["choices"], seen  # the built app answered
    if row.seam == "hf export":
        model, folder, force = seen["export"]
        assert model == "smollm2-135m" and force is True and str(folder).endswith("hf")
    if row.seam == "lab page":
        assert b"ctxlab lab" in seen["page"]
