"""Numbers from flags, configs and traces that are finite but absurd, and paths a config
names that leave the output folder: each is one sentence naming the limit, up front, before
any model loads or any request is sent (issue 33's third and fourth classes)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.errors import CtxlabError
from ctxlab.inputs import machine


def _never(*_args, **_kwargs):
    raise AssertionError("the work started although its input was refused")


@given(st.integers(min_value=-(10**12), max_value=10**12))
@settings(max_examples=80, deadline=None)
def test_a_thread_count_is_accepted_exactly_in_its_range(value):
    high = machine.OVERSUBSCRIBE * machine.usable_cpus()
    if 1 <= value <= high:
        assert machine.check_threads(value) == value
    elif value < 1:
        with pytest.raises(CtxlabError, match="must be at least 1"):
            machine.check_threads(value)
    else:
        with pytest.raises(CtxlabError, match=rf"give 1 to {high}\."):
            machine.check_threads(value)


def test_threads_of_a_billion_is_refused_before_the_model_loads(cli, monkeypatch):
    monkeypatch.setattr("ctxlab.commands.generate.open_model", _never, raising=False)
    r = cli("generate", "hi", "--threads", str(10**9), "--max-tokens", "1")
    assert r.code == 2
    assert r.err_lines == [
        f"error: --threads 1,000,000,000 is more than {machine.OVERSUBSCRIBE} per CPU this "
        f"process may use ({machine.usable_cpus()} CPUs); give 1 to "
        f"{machine.OVERSUBSCRIBE * machine.usable_cpus()}."
    ]


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ("[engine]\nkv_pool_tokens = 1000000000000", "engine.kv_pool_tokens = 1000000000000"),
        ("[engine]\npage_size = 1000000000000", "engine.page_size = 1000000000000"),
        ("[page_size]\npage_sizes = [1, 1000000000]", "page_size.page_sizes needs 1000000000"),
        ('[offload]\noffload_bytes = "1e400"', "is absurdly large; ctxlab accepts up to 1 EiB"),
        ("[offload]\noffload_bytes = 1e400", "holds 1e400, which is not a finite number"),
        ("[model]\nthreads = 1000000000", "threads 1,000,000,000 is more than"),
        ('[offload]\noffload_dir = "/tmp/elsewhere"', "leaves the run's output folder"),
        ('[offload]\noffload_dir = "../../x"', "leaves the run's output folder"),
    ],
)
def test_a_workshop_config_with_absurd_numbers_or_escaping_paths_is_one_sentence(
    cli, tmp_path, monkeypatch, toml, said
):
    monkeypatch.setattr("ctxlab.workshop.runner.run_workshop", _never)
    config = tmp_path / "ws.toml"
    config.write_text(toml + "\n")
    r = cli("workshop", str(config), "--out", str(tmp_path / "out"))
    assert r.code == 2
    assert len(r.err_lines) == 1 and said in r.err, r.err


def test_a_kv_pool_past_the_available_memory_is_refused_before_allocation(monkeypatch):
    import torch

    from ctxlab.kv.layout import KVLayout
    from ctxlab.kv.manager import KVCacheManager

    layout = KVLayout(n_layers=30, n_kv_heads=3, head_dim=64, head_dim_v=64, dtype=torch.float32)
    monkeypatch.setattr(machine, "available_memory", lambda: 2**30)
    with pytest.raises(CtxlabError, match=r"the KV pool of 1,000,000,000,000 tokens needs"):
        KVCacheManager(layout, 10**12)
    with pytest.raises(CtxlabError, match=r"more than the 1\.0 GiB this machine has available"):
        KVCacheManager(layout, 10**6)  # 46 GiB
    KVCacheManager(layout, 4096)  # 180 MiB: fits


def _trace(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.mark.parametrize(
    ("records", "said"),
    [
        (
            [{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]},
             {"timestamp": 31 * 365 * 86400 * 1000, "input_length": 10, "output_length": 5,
              "hash_ids": [2]}],
            "replaying it takes 31.0 years (line 2 arrives that long after the first), past "
            "the 24.0 hours a replay may wait; give --trace-time-scale",
        ),
        (
            [{"timestamp": 0, "input_length": 10, "output_length": 10**9, "hash_ids": [1]}],
            "line 1: 10 prompt and 1,000,000,000 output tokens, past the 10,000,000 tokens",
        ),
    ],
)  # fmt: skip
def test_bench_serve_refuses_a_trace_it_cannot_replay_before_any_request(
    cli, tmp_path, monkeypatch, records, said
):
    monkeypatch.setattr("ctxlab.bench.serve.run_bench", _never)
    trace = _trace(tmp_path / "t.jsonl", records)
    r = cli("bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "m",
            "--dataset", "trace", "--trace", trace, "--out", str(tmp_path / "out"))  # fmt: skip
    assert r.code == 2, r.err
    assert len(r.err_lines) == 1 and said in r.err, r.err


def test_a_scaled_replay_within_a_day_is_accepted(tmp_path):
    from ctxlab.bench.workloads import trace_requests

    records = [
        {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]},
        {"timestamp": 48 * 3600 * 1000, "input_length": 10, "output_length": 5, "hash_ids": [2]},
    ]
    path = tmp_path / "t.jsonl"
    _trace(path, records)
    with pytest.raises(CtxlabError, match=r"--trace-time-scale 0\.5 or less"):
        trace_requests(path, 512, None, 1.0)
    reqs = trace_requests(path, 512, None, 0.5)
    assert [r.arrival for r in reqs] == [0.0, 24 * 3600.0]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--request-rate", "1e-300"], "spreads 2 requests over "),
        (["--request-rate", "1e-6", "--num-prompts", "3"], "spreads 3 requests over "),
        (["--request-rate", "1e-200", "--burstiness", "1e-200"], "burstiness 1e-200"),
    ],
)
def test_bench_serve_refuses_a_rate_it_would_wait_on_for_years(
    cli, tmp_path, monkeypatch, flags, said
):
    """--request-rate 1e-300 waited 1e300 s for its second request (the trace replay's day
    bound held only for traces): one sentence before any request."""
    monkeypatch.setattr("ctxlab.bench.serve.run_bench", _never)
    r = cli("bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "m",
            "--num-prompts", "2", *flags, "--out", str(tmp_path / "out"))  # fmt: skip
    assert r.code == 2, (r.out, r.err)
    assert len(r.err_lines) == 1 and said in r.err and "a run may wait" in r.err, r.err
    assert len(r.err) < 400, r.err  # a span of 1e300 s is "1.78e+292 years", not 300 digits


@given(
    n=st.integers(1, 500),
    rate=st.floats(1e-300, 1e300),
    burstiness=st.floats(1e-300, 1e3),
)
@settings(max_examples=200, deadline=None)
def test_arrival_times_fit_in_a_day_or_are_refused(n, rate, burstiness):
    from ctxlab.bench.runner import arrival_times
    from ctxlab.bench.workloads import MAX_REPLAY_S

    try:
        times = arrival_times(n, rate, burstiness, 0)
    except CtxlabError as exc:
        assert "a run may wait" in str(exc)
        return
    assert len(times) == n and times[0] == 0.0
    assert all(0.0 <= t <= MAX_REPLAY_S for t in times)
    assert times == sorted(times)
