"""Hypothesis over config.json fields: never a traceback, never a plan of an impossible model.

Each example takes a real config (Llama, Gemma 3, DeepSeek-V3, Jamba, ...) and replaces a few
fields with arbitrary JSON values. The reader must either refuse with one CtxlabError
sentence or return an architecture that obeys the rules a real model obeys, and the planner
must then plan it or refuse it with one sentence as well.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxlab.arch import from_hf_config
from ctxlab.arch.limits import MAX_HEADS, MAX_LAYERS
from ctxlab.errors import CtxlabError
from ctxlab.plan.report import build_plan

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*.json"))
BASES = [json.loads(p.read_text()) for p in FIXTURES]
LLAMA = json.loads((Path(__file__).parent / "fixtures" / "llama-3.1-8b.json").read_text())
FIELDS = sorted({key for cfg in BASES for key, value in cfg.items() if not isinstance(value, dict)})

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**70),
    st.sampled_from([0, 1, 2, 3, 7, 8, 64, 10**9, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-2, max_value=64), max_size=6),
    st.lists(st.sampled_from(["full_attention", "sliding_attention", "mamba", "x"]), max_size=8),
)
changes = st.dictionaries(st.sampled_from(FIELDS), values, min_size=1, max_size=4)


def _check_spec(spec) -> None:
    assert 1 <= spec.n_layers <= MAX_LAYERS
    assert 1 <= spec.n_query_heads <= MAX_HEADS
    for layer in spec.layers:
        if layer.kind in ("full", "sliding"):
            assert layer.kv_heads <= spec.n_query_heads
            assert spec.n_query_heads % layer.kv_heads == 0
    assert spec.kv_bytes_per_token() >= 0
    assert spec.request_bytes(4096) >= 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(range(len(BASES))), change=changes)
def test_mutated_configs_are_read_or_refused_in_one_sentence(base, change):
    cfg = {**BASES[base], **change}
    try:
        spec = from_hf_config(cfg)
    except CtxlabError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    _check_spec(spec)
    try:
        plan = build_plan(spec, [4096, 32768], gpus=None)
    except CtxlabError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert plan["inputs"]["gpus"] >= 1
    assert all(row["kv_bytes_per_request"] >= 0 for row in plan["per_context"])


@settings(max_examples=60, deadline=None)
@given(heads=st.integers(min_value=1, max_value=128), kv=st.integers(min_value=1, max_value=128))
def test_head_counts_a_kernel_cannot_run_are_refused(heads, kv):
    cfg = {**LLAMA, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 64}
    possible = kv <= heads and heads % kv == 0
    try:
        spec = from_hf_config(cfg)
    except CtxlabError as exc:
        assert not possible, exc
        assert "KV heads" in str(exc)
        return
    assert possible
    _check_spec(spec)


def test_the_plan_cli_refuses_a_fuzzed_impossible_config(tmp_path):
    """The same through the command line: exit 2 and one line, for two impossible files."""
    from tests.cli.conftest import run_fresh

    for change in ({"num_key_value_heads": 48}, {"num_hidden_layers": 2**40}):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**LLAMA, **change}))
        result = run_fresh("plan", "--config", str(path))
        assert result.code == 2 and len(result.err_lines) == 1, result.err
