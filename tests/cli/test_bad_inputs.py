"""Every class of bad input from the two hostile tours: exit code 2, one line, no traceback.

Each case names the class it stands for; the message must say what is wrong (the expected
fragment), so a misleading sentence fails as surely as a traceback or a silent exit 0.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

BASE_CONFIG = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
}


def _tiny_gguf(path: Path) -> Path:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(2048)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def files(tmp_path: Path, monkeypatch) -> dict[str, str]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "adir").mkdir()
    (tmp_path / "empty.jsonl").write_text("")
    for name, change in (
        ("huge", {"num_hidden_layers": 10**9}),
        ("heads", {"num_attention_heads": 10**6}),
        ("kv64", {"num_key_value_heads": 64}),
        ("kv7", {"num_key_value_heads": 7}),
    ):
        (tmp_path / f"{name}.json").write_text(json.dumps({**BASE_CONFIG, **change}))
    steps = [
        {"prefill_tokens": 10 * i, "prefill_keys": 100 * i, "decode_tokens": i,
         "decode_keys": 50 * i, "seconds": -1.0}
        for i in range(1, 8)
    ]  # fmt: skip
    (tmp_path / "negprof.json").write_text(
        json.dumps({"format": "ctxlab-step-profile/1", "steps": steps})
    )
    (tmp_path / "huge_trace.jsonl").write_text(
        json.dumps({"timestamp": 0, "input_length": 10**12, "output_length": 5, "hash_ids": []})
        + "\n"
    )
    good = _tiny_gguf(tmp_path / "good.gguf")
    (tmp_path / "trunc.gguf").write_bytes(good.read_bytes()[:120])
    return {"tmp": str(tmp_path)}


SYN = "synthetic:n=20"
CASES = [
    # an unsupported plot extension, a folder or no extension as the plot file
    ("plot-extension", ["plan", "llama-3.1-8b", "--plot", "kv.txt"], "plots are PNG files"),
    ("plot-no-extension", ["plan", "llama-3.1-8b", "--plot", "kv"], "has no extension"),
    ("plot-is-a-folder", ["plan", "llama-3.1-8b", "--plot", "adir"], "is a folder"),
    # an output path that is a file (or a folder where a file goes)
    ("out-file-simulate", ["simulate", SYN, "llama-3.1-8b", "--out", "afile"], "is a file"),
    ("out-file-tour", ["tour", "--no-model", "--out", "afile"], "is a file"),
    ("out-file-eval", ["eval", "--out", "afile"], "is a file"),
    ("out-file-ppl", ["eval", "perplexity", "--out", "afile"], "is a file"),
    ("out-file-lim", ["eval", "lost-in-middle", "--out", "afile"], "is a file"),
    ("out-file-calibrate", ["simulate", "--calibrate", "--out", "afile"], "is a file"),
    ("out-folder-profile", ["profile", "--out", "adir"], "is a folder"),
    # sizes far beyond any real model
    ("absurd-layers-plan", ["plan", "--config", "huge.json"], "absurdly large"),
    ("absurd-layers-sim", ["simulate", SYN, "--config", "huge.json"], "absurdly large"),
    ("absurd-heads", ["plan", "--config", "heads.json"], "absurdly large"),
    ("absurd-context", ["plan", "llama-3.1-8b", "--context", "1000000000000"], "absurdly large"),
    ("absurd-page", ["plan", "llama-3.1-8b", "--page-size", "1000000000"], "absurdly large"),
    ("absurd-synthetic", ["simulate", "synthetic:n=1000000000", "llama-3.1-8b"], "absurdly"),
    ("absurd-gpus", ["plan", "llama-3.1-8b", "--gpus", "1000000000"], "ctxlab accepts up to 4,096"),
    ("absurd-trace-line", ["simulate", "huge_trace.jsonl", "llama-3.1-8b"], "line 1"),
    # impossible head counts
    ("kv-heads-above-query", ["plan", "--config", "kv64.json"], "64 KV heads for 32"),
    ("kv-heads-not-divisor", ["plan", "--config", "kv7.json"], "not a multiple of 7"),
    ("kv-heads-sim", ["simulate", SYN, "--config", "kv7.json"], "not a multiple of 7"),
    # a profile with negative step times
    ("negative-profile", ["simulate", SYN, "llama-3.1-8b", "--profile", "negprof.json"],
     "must be a positive number"),
    # a shared prefix longer than the context
    ("prefix-above-context",
     ["plan", "llama-3.1-8b", "--shared-prefix", "999999", "--context", "4096"],
     "cannot exceed the context length"),
    # a rows file with no rows, or not a rows file
    ("summarize-empty", ["eval", "summarize", "empty.jsonl"], "holds no rows"),
    ("summarize-not-rows", ["eval", "summarize", "kv7.json"], "line 1"),
    # one GGUF reader, one sentence for a truncated file
    ("gguf-truncated-plan", ["plan", "--gguf", "trunc.gguf"], "truncated or corrupt GGUF"),
    # a folder where a file goes says so
    ("gguf-dir", ["plan", "--gguf", "adir"], "is a directory"),
    ("file-dir", ["generate", "--file", "adir"], "is a directory"),
    ("profile-dir", ["simulate", SYN, "llama-3.1-8b", "--profile", "adir"], "is a directory"),
    ("rows-dir", ["eval", "summarize", "adir"], "is a directory"),
    ("trace-dir", ["simulate", "adir", "llama-3.1-8b"], "is a directory"),
    # two architecture sources: the same sentence everywhere
    ("two-sources-plan", ["plan", "llama-3.1-8b", "--config", "kv7.json"], "exactly one"),
    ("two-sources-sim", ["simulate", SYN, "llama-3.1-8b", "--gguf", "good.gguf"], "exactly one"),
    # weights that an explicit device count cannot hold name the count that would
    # the planner rounds the GPUs it names up to a tensor-parallel size vLLM accepts (11 -> 16)
    ("gpus-too-few-plan", ["plan", "llama-3.1-405b", "--gpus", "2"], "16 x h100 would hold"),
    ("gpus-too-few-sim", ["simulate", SYN, "llama-3.1-405b", "--gpus", "1"], "11 x h100"),
    # early checks of the engine commands
    ("policy-unknown-eval", ["eval", "--policy", "nope"], "policy 'nope' is unknown"),
    ("kv-format", ["generate", "hi", "--kv-format", "int3"], "--kv-format 'int3'"),
    ("kv-cache-dtype", ["serve", "--kv-cache-dtype", "fp8"], "--kv-cache-dtype 'fp8' is unknown"),
    (
        "kv-cache-dtype-split",
        ["serve", "--disaggregated", "--kv-cache-dtype", "bfloat16"],
        "give no --kv-cache-dtype",
    ),
    (
        "kv-cache-dtype-and-format",
        ["generate", "hi", "--kv-cache-dtype", "bfloat16", "--kv-format", "int8"],
        "not both",
    ),
    ("weights", ["generate", "hi", "--weights", "q4"], "--weights 'q4' is unknown"),
    ("weights-serve", ["serve", "--weights", "int3"], "--weights 'int3' is unknown"),
    ("temperature", ["generate", "hi", "--temperature", "-1"], "--temperature"),
    ("top-p", ["generate", "hi", "--top-p", "2"], "--top-p"),
    ("page-size", ["generate", "hi", "--block-size", "0"], "--page-size must be at least 1"),
    ("ppl-args", ["eval", "perplexity", "--tokens", "10"], "must be longer than the cache"),
    ("profile-pool", ["profile", "--kv-pool-tokens", "64"], "raise --kv-pool-tokens"),
    ("threads", ["generate", "hi", "--threads", "0"], "--threads must be at least 1"),
    ("threads-serve", ["serve", "--threads", "0"], "--threads must be at least 1"),
    ("offload-bytes", ["generate", "hi", "--offload-bytes", "lots"], "--offload-bytes 'lots'"),
    ("offload-zero", ["serve", "--offload-bytes", "0"], "--offload-bytes 0 keeps nothing"),
    (
        "offload-kv-format",
        ["generate", "hi", "--offload-bytes", "1MiB", "--kv-format", "int8"],
        "cannot be combined with --kv-format int8",
    ),
    (
        "offload-no-cache",
        ["generate", "hi", "--offload-bytes", "1MiB", "--no-prefix-cache"],
        "drop --no-prefix-cache",
    ),
    ("threads-ppl", ["eval", "perplexity", "--threads", "0"], "--threads must be at least 1"),
    ("threads-lim", ["eval", "lost-in-middle", "--threads", "0"], "--threads must be at least 1"),
    # what the argument parser itself refuses: one line that points at --help, not a panel
    ("unknown-option", ["plan", "--nonexistent"], "see 'ctxlab plan --help'"),
    ("unknown-command", ["nosuch"], "No such command 'nosuch'"),
    ("not-a-number", ["simulate", SYN, "--rate", "x"], "'--rate'"),
]  # fmt: skip


@pytest.mark.parametrize("args,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_sentence_with_exit_2(cli, files, args, expected):
    result = cli(*args)
    assert result.code == 2, (result.out, result.err)
    assert "Traceback" not in result.err + result.out
    lines = [line for line in result.err_lines if line.startswith("error:")]
    assert len(lines) == 1, result.err
    assert expected in lines[0], lines[0]


def test_truncated_gguf_reads_the_same_in_plan_and_generate(cli, files):
    plan = cli("plan", "--gguf", "trunc.gguf")
    generate = cli("generate", "hi", "--model", "trunc.gguf")
    assert plan.code == generate.code == 2
    assert plan.err_lines[-1] == generate.err_lines[-1]


def test_unknown_policy_is_named_not_budget(cli, files):
    result = cli("eval", "--policy", "full,nope")
    assert "needs a budget" not in result.err and "'nope' is unknown" in result.err


# -- the second tour: fixed by class, each class with its cases -----------------------------

BERT = {
    "architectures": ["BertForMaskedLM"],
    "model_type": "bert",
    "num_hidden_layers": 12,
    "hidden_size": 768,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
}


def _gguf_bytes(version: int, kv: bytes = b"", n_kv: int = 0) -> bytes:
    """A GGUF header with no tensors: magic, version, counts, then `kv` (n_kv entries)."""
    return b"GGUF" + struct.pack("<IQQ", version, 0, n_kv) + kv


def _nested_gguf_array(depth: int) -> bytes:
    """One key whose value is an array of arrays `depth` deep around an empty uint32 array."""
    key = struct.pack("<Q", 1) + b"x" + struct.pack("<I", 9)
    return key + struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0)


@pytest.fixture
def tour2(files: dict[str, str]) -> dict[str, str]:
    tmp = Path(files["tmp"])
    (tmp / "bert.json").write_text(json.dumps(BERT))
    (tmp / "v99.gguf").write_bytes(_gguf_bytes(99))
    arch = struct.pack("<Q", 20) + b"general.architecture" + struct.pack("<IQ", 8, 4) + b"bert"
    (tmp / "bert.gguf").write_bytes(_gguf_bytes(3, arch, n_kv=1))
    (tmp / "header.gguf").write_bytes(_gguf_bytes(3))
    (tmp / "nested.gguf").write_bytes(_gguf_bytes(3, _nested_gguf_array(5000), n_kv=1))
    (tmp / "latin1.jsonl").write_bytes(
        '{"role": "user", "content": "caf\u00e9 cr\u00e8me"}\n'.encode("latin-1")
    )
    (tmp / "pool_inf.toml").write_text("[recurrent_vs_kv]\npool_gib = inf\n")
    (tmp / "prompt.txt").write_text("Once upon a time")
    (tmp / "empty_list.json").write_text("[]")
    (tmp / "surrogate.txt").write_bytes(b"a \xed\xa0\x80 b")  # U+D800 encoded: not UTF-8
    return files


CASES_2 = [
    # non-UTF-8 files: the one reader names the file and the byte
    ("latin1-history", ["memory", "import", "latin1.jsonl", "--db", "m.db"],
     "latin1.jsonl is not UTF-8 text: byte 32 (0xe9)"),
    # numbers: finite everywhere, positive where they divide or count
    ("nan-flops", ["plan", "llama-3.1-8b", "--device-flops", "nan"], "must be a finite number"),
    ("inf-bandwidth-json", ["plan", "llama-3.1-8b", "--device-bandwidth", "inf", "--json"],
     "--device-bandwidth must be a finite number"),
    ("nan-threshold", ["eval", "--threshold", "nan"], "--threshold must be a finite number"),
    ("threshold-range", ["eval", "summarize", "empty.jsonl", "--threshold", "500"], "(0, 100]"),
    ("hash-block-0", ["simulate", SYN, "llama-3.1-8b", "--hash-block", "0"], "--hash-block"),
    ("hash-block-neg", ["simulate", SYN, "llama-3.1-8b", "--hash-block", "-16"], "--hash-block"),
    ("hash-block-csv", ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "m",
                        "--trace-hash-block", "0"], "--trace-hash-block"),
    ("pool-gib-inf", ["workshop", "pool_inf.toml"], "inf, which is not a finite number"),
    ("bench-timeout-0", ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "m",
                         "--timeout", "0"], "--timeout must be positive"),
    ("rate-nan", ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "m",
                  "--request-rate", "nan"], "--request-rate must be a finite number"),
    # seeds: [0, 2**64)
    ("seed-2-64-generate", ["generate", "hi", "--seed", str(2**64)], "--seed"),
    ("seed-2-64-simulate", ["simulate", SYN, "llama-3.1-8b", "--seed", str(2**64)], "--seed"),
    ("seed-negative", ["eval", "lost-in-middle", "--seed", "-1"], "--seed"),
    ("seed-synthetic", ["simulate", "synthetic:n=5,seed=-1", "llama-3.1-8b"], "synthetic seed"),
    # text: an argument of bytes that are not UTF-8 arrives as lone surrogates
    ("surrogate-prompt", ["generate", "hi \udcff there"], "PROMPT holds a lone surrogate"),
    ("surrogate-query", ["memory", "search", "caf\udce9", "--db", "m.db"], "lone surrogate"),
    ("surrogate-file", ["generate", "--file", "surrogate.txt"], "not UTF-8 text: byte 2 (0xed)"),
    # uvicorn's options before anything loads (and before `ready`)
    ("log-level", ["serve", "--log-level", "loud"], "--log-level 'loud' is unknown"),
    # a path that must exist is not created
    ("rag-docs-typo", ["rag", "docs", "--db", "TYPO.db"], "TYPO.db does not exist"),
    ("memory-search-typo", ["memory", "search", "x", "--db", "TYPO.db"], "does not exist"),
    ("memory-core-typo", ["memory", "core", "--db", "TYPO.db"], "TYPO.db does not exist"),
    ("memory-import-empty-list", ["memory", "import", "empty_list.json"], "holds no messages"),
    # misleading messages, now saying what is wrong
    ("gguf-version-99", ["plan", "--gguf", "v99.gguf"], "version 99, which is not supported"),
    ("gguf-header-only-plan", ["plan", "--gguf", "header.gguf"], "header.gguf"),
    ("gguf-header-only-generate", ["generate", "hi", "--model", "header.gguf"],
     "header.gguf holds a GGUF header but no tensors"),
    ("gguf-nested-arrays", ["plan", "--gguf", "nested.gguf"], "nest deeper than 64"),
    ("prompt-and-file", ["generate", "hi", "--file", "prompt.txt"], "not both"),
    ("memory-search-empty", ["memory", "search", "", "--db", "m.db"], "the query is empty"),
    ("workshop-only-superscript", ["workshop", "--only", "\u00b2"], "is not a demonstration"),
    ("workshop-server-timeout-0", ["workshop", "--server-timeout", "0"],
     "--server-timeout must be positive"),
    ("workshop-server-timeout-year", ["workshop", "--server-timeout", "31536000"],
     "--server-timeout 31536000: must be more than 0 and at most 86400 seconds (a day)"),
    ("encoder-only", ["plan", "--config", "bert.json"], "encoder-only model"),
    ("encoder-only-sim", ["simulate", SYN, "--config", "bert.json"], "encoder-only model"),
    ("encoder-only-gguf", ["plan", "--gguf", "bert.gguf"], "'bert' is an encoder-only model"),
]  # fmt: skip


@pytest.mark.parametrize("args,expected", [c[1:] for c in CASES_2], ids=[c[0] for c in CASES_2])
def test_second_tour_is_one_sentence_with_exit_2(cli, tour2, args, expected):
    result = cli(*args)
    assert result.code == 2, (result.out, result.err)
    assert "Traceback" not in result.err + result.out
    lines = [line for line in result.err_lines if line.startswith("error:")]
    assert len(lines) == 1, result.err
    assert expected in lines[0], lines[0]


def test_a_typo_db_is_not_created(cli, tour2):
    cli("rag", "docs", "--db", "TYPO.db")
    cli("memory", "search", "x", "--db", "TYPO.db")
    assert not (Path(tour2["tmp"]) / "TYPO.db").exists()


def test_every_float_option_refuses_nan_and_inf(cli, files):
    """One check for every number option of every command, found by walking the CLI."""
    import typer

    from ctxlab.cli import app

    def walk(command, path):
        yield path, command
        for name, sub in (getattr(command, "commands", None) or {}).items():
            yield from walk(sub, [*path, name])

    checked = 0
    for path, command in walk(typer.main.get_command(app), []):
        for param in command.params:
            if getattr(getattr(param, "type_descriptor", None), "annotation", None) is not float:
                continue
            flag = param.opts[0]
            for bad in ("nan", "-inf") + (() if param.default == float("inf") else ("inf",)):
                result = cli(*path, flag, bad)
                assert result.code == 2, (path, flag, bad, result.err)
                assert f"{flag} must be a finite number" in result.err, result.err
            checked += 1
    assert checked >= 30  # plan, simulate, generate, serve, eval, bench, memory, rag


def test_json_output_holds_only_json_numbers(cli, files):
    """--json never prints NaN or Infinity: strict parsing of what plan and simulate print."""

    def strict(token: str) -> float:
        raise AssertionError(f"--json printed {token}")

    cost = ["--gpu-hourly", "2", "--gpu-seconds", "1"]
    for args in (["plan", "llama-3.1-8b,deepseek-v3,jamba-v0.1", "--json"],
                 ["simulate", SYN, "llama-3.1-8b", "--json"],
                 ["plan", "llama-3.1-8b", *cost, "--json"]):  # fmt: skip
        result = cli(*args)
        assert result.code == 0, result.err
        json.loads(result.out, parse_constant=strict)


def test_a_bad_log_level_fails_before_ready():
    import socket

    from fastapi import FastAPI

    from ctxlab.errors import CtxlabError
    from ctxlab.serve.server import serve

    said: list[str] = []
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        with pytest.raises(CtxlabError, match="--log-level 'loud' is unknown"):
            serve(FastAPI(), sock, "loud", on_ready=said.append)
    assert said == []  # `ready` was never printed


# -- hypothesis: arbitrary bytes as every text-file argument, any depth as every JSON input --

FILE_ARGS = {
    "plan --config": ["plan", "--config", "{f}"],
    "simulate trace.jsonl": ["simulate", "{f}.jsonl", "llama-3.1-8b"],
    "simulate trace.csv": ["simulate", "{f}.csv", "llama-3.1-8b"],
    "simulate --profile": ["simulate", SYN, "llama-3.1-8b", "--profile", "{f}"],
    "bench --trace": ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "m",
                      "--dataset", "trace", "--trace", "{f}"],
    "generate --file": ["generate", "--file", "{f}"],
    "memory import": ["memory", "import", "{f}", "--db", "m.db"],
    "workshop CONFIG": ["workshop", "{f}"],
    "eval summarize": ["eval", "summarize", "{f}"],
    "serve --api-keys": ["serve", "--api-keys", "{f}"],
    "rag ingest": ["rag", "ingest", "{f}.txt", "--db", "kb.db"],
}  # fmt: skip
SETTINGS = settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _args(template: list[str], path: str) -> list[str]:
    return [a.replace("{f}", path) for a in template]


@SETTINGS
@given(
    data=st.binary(max_size=200), cut=st.integers(0, 200), bad=st.sampled_from([0x80, 0xFF, 0xC3])
)
def test_non_utf8_bytes_in_every_file_argument_name_the_file_and_byte(cli, files, data, cut, bad):
    """Bytes with one that cannot start UTF-8 text where it stands: each command names the
    file and the first bad byte's offset, exit 2, before any model loads."""
    cut = min(cut, len(data))
    raw = data[:cut] + bytes([bad]) + (b"\x00" if bad == 0xC3 else b"") + data[cut:]
    offset = _first_bad(raw)
    assume(offset is not None)  # a lone 0x80 after a lead byte (b"\xc2\x80") is valid text
    for name, template in FILE_ARGS.items():
        args = _args(template, "input")
        path = next(a for a in args if a.startswith("input"))
        Path(path).write_bytes(raw)
        result = cli(*args)
        assert result.code == 2, (name, result.err)
        lines = [line for line in result.err_lines if line.startswith("error:")]
        assert len(lines) == 1 and "Traceback" not in result.err, (name, result.err)
        assert f"{path} is not UTF-8 text: byte {offset} " in lines[0], (name, lines[0])


def _first_bad(raw: bytes) -> int | None:
    """The offset of the first byte that is not UTF-8 text, or None when all of it is."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return None


CHEAP_FILE_ARGS = ("plan --config", "simulate trace.jsonl", "simulate trace.csv",
                   "simulate --profile", "eval summarize", "memory import")  # fmt: skip


@SETTINGS
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes_are_one_sentence(cli, files, raw):
    """Any bytes at all (text or not): one sentence and exit 2, never a traceback."""
    for name in CHEAP_FILE_ARGS:
        args = _args(FILE_ARGS[name], "input")
        Path(next(a for a in args if a.startswith("input"))).write_bytes(raw)
        result = cli(*args)
        assert result.code == 2, (name, raw, result.out, result.err)
        assert "Traceback" not in result.err, (name, result.err)
        assert len([ln for ln in result.err_lines if ln.startswith("error:")]) == 1, result.err


def _nest(depth: int) -> str:
    return "[" * depth + "]" * depth


def _message(depth: int, content: str = '"hi"') -> str:
    return f'{{"role": "user", "content": {content}, "x": {_nest(depth)}}}'


DEPTH_INPUTS = {
    # name: (file name, its text at a depth, levels around the nest, the command)
    "plan --config": ("c.json", lambda d: json.dumps(BASE_CONFIG)[:-1] + f', "x": {_nest(d)}}}',
                      1, ["plan", "--config", "c.json"]),
    "trace line": ("t.jsonl", lambda d: f'{{"timestamp": 0, "x": {_nest(d)}}}\n',
                   1, ["simulate", "t.jsonl", "llama-3.1-8b"]),
    "memory import list": ("h.json", lambda d: f"[{_message(d)}]",
                           2, ["memory", "import", "h.json", "--db", "m.db"]),
    "memory import lines": ("h.jsonl", lambda d: _message(d, "1") + "\n",
                            1, ["memory", "import", "h.jsonl", "--db", "m.db"]),
    "workshop TOML": ("w.toml", lambda d: f"x = {_nest(d)}\n", 1, ["workshop", "w.toml"]),
    "step profile": ("p.json", lambda d: f'{{"format": 1, "x": {_nest(d)}}}',
                     1, ["simulate", SYN, "llama-3.1-8b", "--profile", "p.json"]),
    "rows file": ("r.jsonl", lambda d: f'{{"x": {_nest(d)}}}\n', 1,
                  ["eval", "summarize", "r.jsonl"]),
    "api keys TOML": ("k.toml", lambda d: f"x = {_nest(d)}\n", 1,
                      ["serve", "--api-keys", "k.toml"]),
}  # fmt: skip


@SETTINGS
@given(depth=st.one_of(st.integers(1, 70), st.integers(70, 20_000)))
def test_json_and_toml_of_any_depth_are_one_sentence(cli, files, depth):
    """Past 64 levels every JSON and TOML input says so; within it, the input is read (and
    refused or used for what it says, never for its depth)."""
    for name, (file_name, text, around, args) in DEPTH_INPUTS.items():
        Path(file_name).write_text(text(depth))
        result = cli(*args)
        lines = [line for line in result.err_lines if line.startswith("error:")]
        assert "Traceback" not in result.err + result.out, (name, result.err)
        deep = "nests deeper than 64 levels" in result.err
        assert deep == (around + depth > 64), (name, depth, result.err)
        if result.code != 0:
            assert result.code == 2 and len(lines) == 1, (name, result.err)


def test_the_lab_api_answers_deep_json_with_400():
    import httpx

    from ctxlab.lab.server import start_in_thread

    server, url = start_in_thread()
    try:
        deep = b'{"preset": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        r = httpx.post(url + "api/plan", content=deep, timeout=30)
        assert r.status_code == 400 and "nests deeper than 64" in r.json()["error"]
        r = httpx.post(url + "api/plan", content=b'{"context": NaN}', timeout=30)
        assert r.status_code == 400 and "NaN" in r.json()["error"]
    finally:
        server.shutdown()


# -- the 429 rule, token ids, a silent server: no model needed ------------------------------


def test_admission_counts_running_and_waiting_and_says_so():
    from types import SimpleNamespace

    from ctxlab.serve.engine_loop import EngineLoop, QueueFull, TooManyPrompts

    engine = SimpleNamespace(max_position=8192, scheduler=SimpleNamespace(max_num_seqs=64))
    loop = EngineLoop(engine, metrics=None, max_waiting=256)  # type: ignore[arg-type]
    loop.submit([object()] * 300)  # an idle server: 64 run, 236 wait  # type: ignore[list-item]
    assert loop.waiting == 300
    loop._cmd.submit.clear()
    loop._running, loop._waiting = 64, 250
    with pytest.raises(QueueFull) as full:
        loop.submit([object()] * 7)  # type: ignore[list-item]
    assert "64 requests are running and 250 waiting, and 7 more" in str(full.value)
    loop.submit([object()] * 6)  # type: ignore[list-item]
    with pytest.raises(TooManyPrompts, match="321 prompts, more than the server ever holds"):
        loop.submit([object()] * 321)  # type: ignore[list-item]


@pytest.mark.parametrize(
    "prompt,expected",
    [
        ([5, -1], "token id -1 at prompt[1] is out of range"),
        ([[1, 2], [3, -4]], "token id -4 at prompt[1][1] is out of range"),
        (5, "the prompt must be text, a list of token ids, or a list of either"),
        ([1, "a"], "the prompt must be text"),
    ],
)
def test_token_ids_are_checked_as_ids(prompt, expected):
    from pydantic import ValidationError

    from ctxlab.serve.errors import validation_error
    from ctxlab.serve.protocol import CompletionRequest

    with pytest.raises(ValidationError) as err:
        CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    assert expected in validation_error(err.value).message


def test_bench_against_a_server_that_never_answers_is_one_sentence(cli, files):
    import socket
    import threading

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])  # accepted, never answered
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        result = cli("bench", "serve", "--base-url", url, "--model", "m", "--num-prompts", "2",
                     "--timeout", "1")  # fmt: skip
    finally:
        stop.set()
        thread.join()
        for s in held:
            s.close()
        sock.close()
    assert result.code == 2, result.err
    assert "accepted the test request but sent nothing for 1 s" in result.err


# -- lengths against the model's positions, before any work (these load the model) --------

LENGTH_CASES = [
    ("generate-max-tokens", ["generate", "hi", "--max-tokens", "100000"],
     "maximum context length is 8192 tokens"),
    ("serve-max-model-len", ["serve", "--port", "0", "--max-model-len", "1000000"],
     "--max-model-len 1,000,000 is beyond the model's 8,192 positions"),
    ("lim-documents", ["eval", "lost-in-middle", "--documents", "100000"],
     "beyond the model's 8,192 positions"),
    ("eval-lengths", ["eval", "--lengths", "100000"], "beyond the model's 8,192 positions"),
    ("memory-window", ["memory", "compact", "--window", "100000"],
     "--window 100,000 is beyond the model's 8,192 positions"),
]  # fmt: skip


@pytest.mark.model
@pytest.mark.parametrize(
    "args,expected", [c[1:] for c in LENGTH_CASES], ids=[c[0] for c in LENGTH_CASES]
)
def test_lengths_beyond_the_models_positions_are_refused_up_front(cli, files, args, expected):
    result = cli(*args)
    assert result.code == 2, (result.out, result.err)
    lines = [line for line in result.err_lines if line.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0], result.err


# -- stores: write access first, an --as-of before everything, idempotent import -----------


def test_a_read_only_store_is_refused_before_sqlite_writes(cli, files, monkeypatch):
    """Root may write a chmod 444 file, so the check is driven through os.access here; the
    real file test below runs where permissions bind."""
    import os

    history = Path("h.jsonl")
    history.write_text('{"role": "user", "content": "hello"}\n')
    Path("doc.txt").write_text("A document.")
    assert cli("memory", "import", "h.jsonl", "--db", "m.db").code == 0
    before = Path("m.db").read_bytes()
    real = os.access

    def access(path: object, mode: int) -> bool:  # m.db readable, not writable
        return real(path, mode) and not (mode & os.W_OK and str(path).endswith("m.db"))

    monkeypatch.setattr(os, "access", access)
    for args in (["memory", "import", "h.jsonl", "--db", "m.db"],
                 ["rag", "ingest", "doc.txt", "--db", "m.db"]):  # fmt: skip
        result = cli(*args)
        assert result.code == 2 and "m.db is read-only" in result.err, result.err
    assert Path("m.db").read_bytes() == before


def test_a_chmod_read_only_store_is_one_sentence(cli, files):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes read-only files; the os.access test above covers the check")
    Path("h.jsonl").write_text('{"role": "user", "content": "hello"}\n')
    assert cli("memory", "import", "h.jsonl", "--db", "m.db").code == 0
    Path("m.db").chmod(0o444)
    result = cli("memory", "import", "h.jsonl", "--db", "m.db")
    assert result.code == 2 and "read-only" in result.err and "Traceback" not in result.err


def test_memory_import_twice_stores_each_message_once(cli, files):
    lines = [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "fine"},
             {"role": "user", "content": "ok"}]  # fmt: skip
    Path("h.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    first = cli("memory", "import", "h.jsonl", "--db", "m.db")
    again = cli("memory", "import", "h.jsonl", "--db", "m.db")
    assert "stored 3 messages" in first.out
    assert "stored 0 messages" in again.out and "(3 already stored, skipped)" in again.out
    grown = [*lines, {"role": "assistant", "content": "new"}]
    Path("h.jsonl").write_text("".join(json.dumps(m) + "\n" for m in grown))
    third = cli("memory", "import", "h.jsonl", "--db", "m.db")
    assert "stored 1 messages" in third.out and "(3 already stored" in third.out
    import sqlite3

    with sqlite3.connect("m.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 4


class _Words:
    """A tokenizer of whitespace words (the TextTokenizer protocol), so no model loads."""

    name = "words"

    def spans(self, text: str) -> list[tuple[int, int]]:
        import re

        return [m.span() for m in re.finditer(r"\S+", text)]


def test_rag_ask_before_every_document_says_nothing_can_be_retrieved(cli, files):
    from ctxlab.memory.store import open_store
    from ctxlab.rag.documents import ingest
    from ctxlab.rag.readers import SourceDoc

    with open_store("kb.db") as store:
        doc = SourceDoc("d1", "The shipyard director is Ada.", "2024-03-01", "Title", "d1.txt")
        ingest(store, doc, _Words(), None, 16, 2)
    result = cli("rag", "ask", "Who is the director?", "--db", "kb.db", "--as-of", "1900-01-01")
    assert result.code == 2
    assert "no document version is dated on or before --as-of 1900-01-01" in result.err
    assert "(the oldest is 2024-03-01)" in result.err
