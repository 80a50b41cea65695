"""`ctxlab plan --engine`: the engine's pool in tables and JSON, mistakes as one sentence."""

from __future__ import annotations

import json

from tests.cli.conftest import run_in_process


def test_vllm_cpu_table_shows_the_published_figures(monkeypatch, capsys):
    r = run_in_process(
        monkeypatch, capsys,
        "plan", "gemma-3-270m", "--context", "32K", "--engine", "vllm", "--platform", "cpu",
        "--kv-cache-bytes", "1GiB",
    )  # fmt: skip
    assert r.code == 0, r.err
    assert "What vLLM allocates" in r.out
    assert "2,730" in r.out and "361" in r.out
    assert "CPU KV cache size: 247,802 tokens" in r.out
    assert "Seven requests of 32,768 tokens run at once (vLLM reports 7.56x)" in r.out
    assert "ideally holds 9: 2 lost" in r.out
    # 361 x 393,216 bytes against 3 x 32,768 x 1,024 + 15 x 512 x 1,024: 33,423,360 more
    text = " ".join(r.out.split())
    assert "takes 135.4 MiB of its pool per request of 32,768 tokens" in text
    assert "the model needs 103.5 MiB: 31.9 MiB (31 %) is allocation overhead" in text


def test_vllm_json_and_max_model_len(monkeypatch, capsys):
    r = run_in_process(
        monkeypatch, capsys,
        "plan", "smollm2-135m", "--context", "4096", "--engine", "vllm", "--platform", "cpu",
        "--kv-cache-bytes", "1GiB", "--max-model-len", "4096", "--json",
    )  # fmt: skip
    assert r.code == 0, r.err
    engine = json.loads(r.out)["engine"]
    assert (engine["num_blocks"], engine["blocks_per_request"]) == (364, 32)
    assert engine["kv_cache_tokens"] == 46_592
    assert engine["max_model_len_source"] == "given"
    assert engine["requests_lost"] == 0
    assert json.loads(r.out)["engine"]["rules"][0]["source"].startswith("vllm/")


def test_plan_without_engine_has_a_null_engine(monkeypatch, capsys):
    r = run_in_process(monkeypatch, capsys, "plan", "smollm2-135m", "-c", "4096", "--json")
    assert r.code == 0
    assert json.loads(r.out)["engine"] is None


def test_gpu_engine_on_the_plans_devices(monkeypatch, capsys):
    r = run_in_process(
        monkeypatch, capsys,
        "plan", "llama-3.1-8b", "-c", "32K", "--engine", "vllm", "--max-model-len", "32K",
        "--activation-bytes", "4GiB", "--json",
    )  # fmt: skip
    assert r.code == 0, r.err
    engine = json.loads(r.out)["engine"]
    # ceil(80 GiB x 0.92) - 16,060,522,496 bytes of weights - 4 GiB, in 2 MiB blocks
    pool = -(-int(80 * 2**30 * 0.92 * 4) // 4) - 16_060_522_496 - 4 * 2**30
    assert abs(engine["pool_bytes"] - pool) <= 1
    assert engine["block_size"] == 16
    assert engine["num_blocks"] == engine["pool_bytes"] // (2 * 2**20)


def test_sglang_and_llamacpp_are_marked_as_documented(monkeypatch, capsys):
    for engine in ("sglang", "llamacpp"):
        r = run_in_process(
            monkeypatch, capsys,
            "plan", "gemma-3-270m", "-c", "32K", "--engine", engine, "--kv-cache-bytes", "1GiB",
            *(("--slots", "4") if engine == "llamacpp" else ()),
        )  # fmt: skip
        assert r.code == 0, r.err
        assert "from the engine's documentation, not measured here" in " ".join(r.out.split())


def test_engine_mistakes_are_one_sentence(monkeypatch, capsys):
    for args, fragment in (
        (("--kv-cache-bytes", "1GiB"), "add --engine"),
        (("--engine", "tgi"), "unknown engine 'tgi'"),
        (("--engine", "vllm", "--platform", "tpu"), "unknown platform 'tpu'"),
        (("--engine", "vllm", "--platform", "cpu"), "VLLM_CPU_KVCACHE_SPACE"),
        (("--engine", "vllm", "--max-model-len", "lots"), "--max-model-len"),
        (("--engine", "vllm", "--gpu-memory-utilization", "1.5"), "memory utilization"),
        (("--engine", "vllm", "--block-size", "0"), "page size must be a positive"),
        (("--engine", "vllm", "--slots", "4"), "--slots is an option of --engine llamacpp"),
        (("--engine", "sglang", "--platform", "cpu"), "--platform is an option of --engine vllm"),
    ):
        r = run_in_process(monkeypatch, capsys, "plan", "smollm2-135m", "-c", "4096", *args)
        assert r.code == 2, (args, r.out, r.err)
        assert fragment in r.err, (args, r.err)
        assert "Traceback" not in r.err
        assert len(r.err_lines) <= 3, r.err


def test_an_engine_that_would_refuse_to_start_says_so(monkeypatch, capsys):
    r = run_in_process(
        monkeypatch, capsys,
        "plan", "smollm2-135m", "-c", "8192", "--engine", "vllm", "--platform", "cpu",
        "--kv-cache-bytes", "20MiB", "--max-model-len", "8192",
    )  # fmt: skip
    assert r.code == 0, r.err
    assert "refuse to start" in r.out
    assert "largest max_model_len that fits is 768" in " ".join(r.out.split())


def test_the_page_size_option_is_the_engines_block_size_when_typed(monkeypatch, capsys):
    args = ("plan", "smollm2-135m", "-c", "4096", "--engine", "vllm", "--platform", "cpu",
            "--kv-cache-bytes", "1GiB", "--max-model-len", "4096", "--json")  # fmt: skip
    default = json.loads(run_in_process(monkeypatch, capsys, *args).out)["engine"]
    assert default["block_size"] == 128  # vLLM's CPU default, not the plan's 16
    typed = json.loads(run_in_process(monkeypatch, capsys, *args, "--block-size", "16").out)
    assert typed["engine"]["block_size"] == 16
    assert typed["engine"]["blocks_per_request"] == 256
