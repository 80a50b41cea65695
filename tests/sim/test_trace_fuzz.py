"""Hypothesis over trace lines: never a traceback, never a simulation of an impossible request.

Lines are valid Mooncake records with a field replaced by an arbitrary JSON value, or raw
text. The reader must refuse the file in one sentence naming the line, or return requests
that obey the format; the simulator then runs what was accepted.
"""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ctxlab.arch import get_preset
from ctxlab.arch.limits import MAX_TOKENS
from ctxlab.errors import CtxlabError
from ctxlab.plan.devices import get_device
from ctxlab.sim.config import SimConfig
from ctxlab.sim.run import simulate
from ctxlab.sim.trace import read_csv, read_mooncake

BLOCK = 512


def _record(i: int, n_in: int, n_out: int) -> dict:
    return {
        "timestamp": 1000 * i,
        "input_length": n_in,
        "output_length": n_out,
        "hash_ids": list(range(i * 100, i * 100 + -(-n_in // BLOCK))),
    }


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**62),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.integers(min_value=-3, max_value=10**6), max_size=4),
)
mutated = st.tuples(
    st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "extra"]), values
)
line = st.one_of(
    st.builds(
        lambda i, n_in, n_out, change: (
            json.dumps({**_record(i, n_in, n_out), change[0]: change[1]})
            if change
            else json.dumps(_record(i, n_in, n_out))
        ),
        st.integers(0, 50),
        st.integers(1, 3000),
        st.integers(1, 50),
        st.one_of(st.none(), mutated),
    ),
    st.text(max_size=20),
)


def _accepted(trace) -> None:
    for r in trace.requests:
        assert 0 < r.input_len <= MAX_TOKENS and 0 < r.output_len <= MAX_TOKENS
        assert math.isfinite(r.arrival) and r.arrival >= 0
        assert len(r.hash_ids) == -(-r.input_len // BLOCK)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(line, min_size=1, max_size=6))
def test_mooncake_lines_are_read_or_refused_naming_a_line(tmp_path, lines):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        trace = read_mooncake(path, BLOCK)
    except CtxlabError as exc:
        assert "\n" not in str(exc)
        assert "line" in str(exc) or "no requests" in str(exc)
        event("refused")
        return
    _accepted(trace)
    try:
        result = simulate(trace, get_preset("llama-3.1-8b"), get_device("h100"), SimConfig())
    except CtxlabError as exc:  # a request whose prompt and output outgrow the whole pool
        assert "\n" not in str(exc) and "more than the whole pool" in str(exc)
        assert "(line " in str(exc)  # the line of the trace it came from
        event("accepted, refused by the simulator")
        return
    event("accepted and simulated")
    assert result.metrics["requests_completed"] == len(trace)


cells = st.one_of(st.integers(-5, 5000), st.floats(allow_nan=True), st.text(max_size=4))


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(st.tuples(cells, cells, cells), min_size=1, max_size=5))
def test_csv_rows_are_read_or_refused(tmp_path, rows):
    path = tmp_path / "trace.csv"
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
    text += "".join(f"{a},{b},{c}\n" for a, b, c in rows)
    path.write_text(text, encoding="utf-8")
    try:
        trace = read_csv(path, BLOCK)
    except CtxlabError as exc:
        assert "\n" not in str(exc)
        return
    _accepted(trace)
