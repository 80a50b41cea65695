"""Trace readers, the synthetic generator, bad input and the CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ctxlab.cli import app
from ctxlab.errors import CtxlabError
from ctxlab.sim.config import SimConfig
from ctxlab.sim.run import simulate
from ctxlab.sim.synthetic import generate_from_spec, parse_spec
from ctxlab.sim.trace import load_trace, read_csv, read_mooncake

from .conftest import real_trace

GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


def _write(tmp_path, lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_mooncake_lines_are_read_in_arrival_order(tmp_path):
    later = {**GOOD, "timestamp": 1500, "hash_ids": [1, 3]}
    path = _write(tmp_path, [json.dumps(later), json.dumps(GOOD)])
    trace = read_mooncake(path)
    assert [r.arrival for r in trace.requests] == [0.0, 1.5]
    assert trace.requests[1].line == 1 and trace.requests[1].hash_ids == (1, 3)


def test_malformed_lines_are_reported_by_number(tmp_path):
    bad_count = {**GOOD, "hash_ids": [1]}  # 600 tokens need two 512-token blocks
    path = _write(tmp_path, [json.dumps(GOOD), "{not json", json.dumps(bad_count), "[]"])
    with pytest.raises(CtxlabError) as err:
        read_mooncake(path)
    msg = str(err.value)
    assert "3 malformed line(s)" in msg
    assert "line 2: not valid JSON" in msg and "line 3: 1 hash_ids" in msg
    assert "line 4: not a JSON object" in msg


def test_csv_reader_and_its_errors(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,1000,10\n0.1,20,3\n")
    trace = read_csv(path)
    assert [(r.arrival, r.input_len) for r in trace.requests] == [(0.1, 20), (0.5, 1000)]
    assert not set(trace.requests[0].hash_ids) & set(trace.requests[1].hash_ids)
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,x,10\n")
    with pytest.raises(CtxlabError, match="line 2"):
        read_csv(path)


def test_synthetic_is_seeded_and_sessions_extend_their_history():
    spec = "n=40,turns=4,groups=2,prefix=1024,input=uniform:100:700,output=50,seed=3"
    a, b = generate_from_spec(spec), generate_from_spec(spec)
    assert [(r.arrival, r.hash_ids) for r in a.requests] == [
        (r.arrival, r.hash_ids) for r in b.requests
    ]
    assert generate_from_spec(spec.replace("seed=3", "seed=4")).requests != a.requests
    # a later turn re-sends an earlier turn's full blocks as its prefix
    ids = [r.hash_ids for r in a.requests]
    extended = sum(
        1 for i, x in enumerate(ids) for y in ids[:i] if len(y) > 2 and x[: len(y) - 1] == y[:-1]
    )
    assert extended > 0
    gaps = generate_from_spec("n=2000,arrival=gamma,cv=3,rate=10,seed=1").requests
    times = [r.arrival for r in gaps]
    diffs = [b - a for a, b in itertools.pairwise(times)]
    mean = sum(diffs) / len(diffs)
    cv = (sum((d - mean) ** 2 for d in diffs) / len(diffs)) ** 0.5 / mean
    assert 2.0 < cv < 4.5  # bursty, unlike Poisson's 1


@pytest.mark.parametrize(
    "spec,needle",
    [("n=0", "positive"), ("bogus=1", "unknown synthetic option"), ("input=zipf:3", "input")],
)
def test_bad_synthetic_specs(spec, needle):
    with pytest.raises(CtxlabError, match=needle):
        parse_spec(spec)


def test_a_request_longer_than_the_pool_is_named(llama8b, h100):
    trace = generate_from_spec("n=5,input=9000,output=10")
    with pytest.raises(CtxlabError, match=r"request 0 needs 9,009 tokens.*whole pool"):
        simulate(trace, llama8b, h100, SimConfig(pool_bytes=2**30))


def test_recurrent_state_takes_a_slot_per_running_request(h100):
    from ctxlab.arch import get_preset

    jamba = get_preset("jamba-v0.1")
    trace = generate_from_spec("n=30,rate=100,input=200,output=20")
    res = simulate(trace, jamba, h100, SimConfig(unlimited=True), check=True)
    assert res.setup.cost.state_bytes > 0
    assert res.metrics["requests_completed"] == 30


def test_cli_json_and_exit_codes(tmp_path):
    runner = CliRunner()
    args = ["simulate", "synthetic:n=30,groups=2,rate=5", "--arch", "llama-3.1-8b"]
    res = runner.invoke(app, [*args, "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    for key in ("reused_token_fraction", "ttft_p50", "ttft_p99", "tpot_p50", "preemptions"):
        assert key in data
    assert data["requests_completed"] == 30
    assert (tmp_path / "usage.png").stat().st_size > 0
    sweep = runner.invoke(
        app, [*args, "--sweep", "page-size=16,64", "--json", "--out", str(tmp_path)]
    )
    assert [r["value"] for r in json.loads(sweep.stdout)["sweep"]["runs"]] == ["16", "64"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ctxlab.cli import main; main()",
            "simulate",
            str(bad),
            "--arch",
            "llama-3.1-8b",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "line 1: missing 'input_length'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_sim_never_imports_torch():
    code = (
        "import sys, ctxlab.sim.run, ctxlab.sim.plots, ctxlab.commands.simulate;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_real_traces_load(tmp_path):
    for name in ("conversation", "synthetic"):
        trace = load_trace(str(real_trace(name)))
        assert len(trace) in (12031, 3993)
