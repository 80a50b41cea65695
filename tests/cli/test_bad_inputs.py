"""Every class of bad input from the first-hour tour: exit code 2, one line, no traceback.

Each case names the class it stands for; the message must say what is wrong (the expected
fragment), so a misleading sentence fails as surely as a traceback or a silent exit 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

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
    ("gpus-too-few-plan", ["plan", "llama-3.1-405b", "--gpus", "2"], "11 x h100 would hold"),
    ("gpus-too-few-sim", ["simulate", SYN, "llama-3.1-405b", "--gpus", "1"], "11 x h100"),
    # early checks of the engine commands
    ("policy-unknown-eval", ["eval", "--policy", "nope"], "policy 'nope' is unknown"),
    ("kv-format", ["generate", "hi", "--kv-format", "int3"], "--kv-format 'int3'"),
    ("weights", ["generate", "hi", "--weights", "q4"], "--weights 'q4' is unknown"),
    ("weights-serve", ["serve", "--weights", "int3"], "--weights 'int3' is unknown"),
    ("temperature", ["generate", "hi", "--temperature", "-1"], "--temperature"),
    ("top-p", ["generate", "hi", "--top-p", "2"], "--top-p"),
    ("page-size", ["generate", "hi", "--block-size", "0"], "--page-size must be at least 1"),
    ("ppl-args", ["eval", "perplexity", "--tokens", "10"], "must be longer than the cache"),
    ("profile-pool", ["profile", "--kv-pool-tokens", "64"], "raise --kv-pool-tokens"),
    ("threads", ["generate", "hi", "--threads", "0"], "--threads must be at least 1"),
    ("threads-serve", ["serve", "--threads", "0"], "--threads must be at least 1"),
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
