"""`ctxlab plan` and `ctxlab tour` through `ctxlab.cli.main`, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cli.conftest import run_in_process

PER_CONTEXT_KEYS = {
    "kv_bytes_per_request",
    "allocated_tokens_per_request",
    "prefill_flops",
    "prefill_seconds",
    "attention_flops_share",
    "decode_seconds_per_token",
    "max_concurrent_requests",
}


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    r = run_in_process(monkeypatch, capsys, *args)
    return r.code, r.out, r.err


def run_subprocess(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "160"}
    return subprocess.run(
        [sys.executable, "-c", "from ctxlab.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_json_has_the_documented_keys(monkeypatch, capsys):
    code, out, _ = run_main(
        monkeypatch,
        capsys,
        "plan", "llama-3.1-8b", "--context", "4096,131072", "--concurrency", "8",
        "--page-size", "16", "--device", "h100", "--json",
    )  # fmt: skip
    assert code == 0
    plan = json.loads(out)
    assert plan["kv_bytes_per_token"] == 131_072
    assert plan["contexts"] == [4096, 131072]
    for row in plan["per_context"]:
        assert set(row) >= PER_CONTEXT_KEYS
    assert plan["per_context"][1]["kv_bytes_per_request"] == 16 * 1024**3
    assert plan["sections"]["memory"]["rows"][1]["kv_bytes_for_concurrency"] == 128 * 1024**3


def test_tables_show_every_section(monkeypatch, capsys):
    code, out, _ = run_main(
        monkeypatch, capsys, "plan", "llama-3.1-8b", "--context", "1001,131072",
        "--weights-bytes", "48GiB", "--reserve-bytes", "8GiB", "--price-input", "3",
        "--price-output", "15", "--gpu-hourly", "2.5",
    )  # fmt: skip
    assert code == 0
    for title in (
        "Logical KV cache", "Page rounding", "Ideal prefix sharing", "Capacity of the KV pool",
        "Prefill at roofline", "Decode at roofline", "Cost per request",
    ):  # fmt: skip
        assert title in out
    assert "one fits, two do not" in out
    assert "1,008" in out
    assert "128.0 KiB" in out


def test_cache_dtype_and_custom_device(monkeypatch, capsys):
    code, out, _ = run_main(
        monkeypatch, capsys, "plan", "llama-3.1-8b", "--context", "128K", "--cache-dtype",
        "int8", "--device", "custom", "--peak-flops", "1e15", "--mem-bandwidth", "2e12",
        "--memory-bytes", "96GiB", "--json",
    )  # fmt: skip
    assert code == 0
    plan = json.loads(out)
    assert plan["per_context"][0]["kv_bytes_per_request"] == 8 * 1024**3
    assert plan["device"]["memory_bytes"] == 96 * 1024**3


def test_plot_writes_png_for_several_archs(monkeypatch, capsys, tmp_path):
    path = tmp_path / "kv.png"
    code, out, _ = run_main(
        monkeypatch, capsys, "plan", "llama-3.1-8b,gemma-3-27b,mistral-7b-v0.1",
        "--context", "4096,131072", "--plot", str(path), "--json",
    )  # fmt: skip
    assert code == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    names = [p["arch"]["name"] for p in json.loads(out)["plans"]]
    assert names == ["llama-3.1-8b", "gemma-3-27b", "mistral-7b-v0.1"]


def test_list_shows_presets_and_devices(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "plan", "--list")
    assert code == 0
    for name in ("llama-3.1-8b", "deepseek-v3", "h100", "h200", "a100-80gb"):
        assert name in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "no-such-model"], "known presets"),
        (["plan", "llama-3.1-8b", "--device", "tpu9"], "known devices"),
        (["plan", "llama-3.1-8b", "--context", "0"], "must be a positive number"),
        (["plan", "llama-3.1-8b", "--context", "-4096"], "must be a positive number"),
        (["plan", "llama-3.1-8b", "--page-size", "0"], "page size must be a positive"),
        (
            ["plan", "llama-3.1-8b", "--price-input", "-1", "--price-output", "15"],
            "input price must be a positive",
        ),
        (
            ["plan", "llama-3.1-8b", "--reserve-bytes", "90GiB", "--gpus", "1"],
            "2 x h100 would hold them",
        ),
        (["plan", "llama-3.1-8b", "--weights-bytes", "lots"], "cannot read"),
        (["plan", "llama-3.1-8b", "--cache-dtype", "fp6"], "known cache dtypes"),
        (["plan"], "give an architecture"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(monkeypatch, capsys, args, message):
    code, out, err = run_main(monkeypatch, capsys, *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1


def test_bad_input_in_a_real_process_has_no_traceback():
    proc = run_subprocess("plan", "llama-3.1-8b", "--reserve-bytes", "90GiB", "--gpus", "1")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "leave no room" in proc.stderr


def test_tour_writes_plot_and_prints_paths(tmp_path):
    out = tmp_path / "tour"
    proc = run_subprocess("tour", "--out", str(out), "--no-model")
    assert proc.returncode == 0, proc.stderr
    assert (out / "kv_vs_context.png").read_bytes()[:4] == b"\x89PNG"
    plan = json.loads((out / "plan_smollm2-135m.json").read_text())
    assert plan["kv_bytes_per_token"] == 30 * 3 * 128 * 2  # 30 layers, 3 KV heads of 64 (K+V)
    assert str(out / "kv_vs_context.png") in proc.stdout.replace("\n", "")
