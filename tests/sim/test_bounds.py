"""Numbers from traces that are finite but absurd, and what cannot be true: a simulation's
memory is bounded before it starts (one request of 10^9 output tokens grew a run to 24 GB
until the kernel killed it), and requests longer than the model's context are clamped with
a printed note instead of simulated without a word."""

from __future__ import annotations

import json
import resource

import pytest

from ctxlab.arch import resolve_arch
from ctxlab.errors import CtxlabError
from ctxlab.sim import bounds
from ctxlab.sim.requests import Request, Trace
from tests.cli.conftest import run_in_process


@pytest.fixture
def cli(monkeypatch, capsys):
    return lambda *args: run_in_process(monkeypatch, capsys, *args)


def _trace(n: int, output: int, input_len: int = 100) -> Trace:
    reqs = [Request(i, float(i), input_len, output, tuple(range(-(-input_len // 512)))) for i in
            range(n)]  # fmt: skip
    return Trace("t.jsonl", reqs)


def test_a_run_past_half_the_available_memory_is_refused_naming_the_limit():
    trace = _trace(10, 10**8)  # 10^9 output tokens: ~60 GiB of timings
    with pytest.raises(CtxlabError, match=r"limit here is about [\d,]+ output tokens") as info:
        bounds.check_memory(trace, available=8 * 2**30)
    assert "1,000,000,000 output tokens" in str(info.value)
    assert "4.0 GiB" not in str(info.value) and "8.0 GiB this machine has available" in str(
        info.value
    )
    bounds.check_memory(_trace(10, 1000), available=8 * 2**30)  # a real trace passes


def test_the_estimate_bounds_what_a_run_really_keeps(tmp_path):
    """The per-token figure is an upper bound: a run's peak memory grows by less."""
    from ctxlab.plan.devices import DEVICES
    from ctxlab.sim.config import SimConfig
    from ctxlab.sim.run import simulate

    arch = resolve_arch(name="llama-3.1-8b")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trace = _trace(1, 1_000_000)
    simulate(trace, arch, DEVICES["h100"], SimConfig(unlimited=True))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown <= bounds.memory_needed(trace)


def test_simulate_refuses_before_it_starts(cli, tmp_path, monkeypatch):
    trace = tmp_path / "t.jsonl"
    line = {"timestamp": 0, "input_length": 100, "output_length": 100_000, "hash_ids": [1]}
    trace.write_text("\n".join(json.dumps({**line, "timestamp": i}) for i in range(100)) + "\n")
    monkeypatch.setattr(bounds, "available_memory", lambda: 256 * 2**20)
    r = cli("simulate", str(trace), "llama-3.1-8b", "--unlimited-cache", "--out",
            str(tmp_path / "out"))  # fmt: skip
    assert r.code == 2
    errors = [line for line in r.err_lines if line.startswith("error:")]
    assert len(errors) == 1 and "more than half of the 0.2 GiB" in errors[0], r.err


def test_requests_past_the_context_are_clamped_with_a_note():
    arch = resolve_arch(name="llama-3.1-8b")
    limit = arch.max_position
    trace = _trace(3, 10)
    trace.requests.append(Request(3, 3.0, limit + 5000, 10**9, tuple(range(-(-(limit + 5000) //
                                                                           512)))))  # fmt: skip
    fitted, note = bounds.fit_to_context(trace, arch)
    assert note is not None and "1 of 4 requests" in note and f"{limit:,}-token context" in note
    last = fitted.requests[-1]
    assert last.input_len == limit - 1 and last.input_len + last.output_len == limit
    assert len(last.hash_ids) == -(-last.input_len // 512)
    assert fitted.requests[:3] == trace.requests[:3]
    same, none = bounds.fit_to_context(_trace(3, 10), arch)
    assert none is None and len(same) == 3


def test_simulate_prints_the_clamp(cli, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 100,
                                 "output_length": 10**9, "hash_ids": [1]}) + "\n")  # fmt: skip
    r = cli("simulate", str(trace), "llama-3.1-8b", "--unlimited-cache", "--json", "--out",
            str(tmp_path / "out"))  # fmt: skip
    assert r.code == 0, r.err
    assert "note: 1 of 1 requests of t.jsonl ask for more than llama-3.1-8b's 131,072" in r.err
