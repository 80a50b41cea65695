"""The eval grid on the real engine: rows carry resident KV measured from the pool."""

import json

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.eval.engine_backend import EngineBackend, prompt_ids, token_counter
from ctxlab.eval.runner import Grid, PolicyRun, run_grid
from ctxlab.eval.suites import parse_policy_runs

pytestmark = pytest.mark.model


def test_counter_counts_exactly_what_the_engine_is_fed(loaded):
    tok = loaded.tokenizer
    ids = prompt_ids(tok, "Where is the key?", "The key is")
    assert token_counter(tok)("Where is the key?", "The key is") == len(ids)
    assert tok.decode(ids).rstrip().endswith("The key is")


def test_full_finds_a_short_needle_and_a_window_costs_less(loaded, tmp_path):
    grid = Grid(
        tasks=["niah_single_noise"],
        lengths=[400],
        depths=[0.5],
        samples=1,
        seed=1,
        runs=[PolicyRun("full"), PolicyRun("window", 64)],
    )
    count = token_counter(loaded.tokenizer)
    rows = run_grid(
        grid,
        count,
        lambda run: EngineBackend(loaded, run, kv_pool_tokens=2048),
        tmp_path / "rows.jsonl",
        "smollm2-135m",
    )
    full, window = rows
    assert full["policy"] == "full" and window["policy"] == "window"
    assert full["score"] == 100.0, full["prediction"]
    # Resident bytes come from the pool: full holds the whole prompt plus output, fp32.
    per_token = 30 * 3 * (64 + 64) * 4
    held = full["prompt_tokens"] + 32
    assert per_token * (held - 32) <= full["resident_kv_bytes"] <= per_token * (held + 16)
    assert window["resident_kv_bytes"] <= per_token * (64 + 16)
    assert [json.loads(x) for x in (tmp_path / "rows.jsonl").read_text().splitlines()] == rows


def test_policy_list_parsing():
    assert parse_policy_runs("full,snapkv@128,h2o", "0.25") == [
        ("full", None),
        ("snapkv", "128"),
        ("h2o", "0.25"),
    ]
    with pytest.raises(CtxlabError, match="needs a budget"):
        parse_policy_runs("full,snapkv", None)


def test_a_bad_policy_late_in_the_list_stops_the_run_before_it_starts():
    with pytest.raises(CtxlabError, match="too small for snapkv"):
        parse_policy_runs("full,h2o@0.25,snapkv@16", None)
    with pytest.raises(CtxlabError, match="unknown"):
        parse_policy_runs("full,snapkv@128,nosuch@64", None)


QUICK_FLOOR = 50.0  # full cache, mean of the quick suite's task means at 512 tokens


def test_quick_suite_end_to_end_full_scores_above_floor(loaded, tmp_path, monkeypatch):
    """The quick suite as `ctxlab eval --suite quick` runs it, sharing the loaded model."""
    import ctxlab.model as model_pkg
    from ctxlab.eval.harness import run_eval
    from ctxlab.eval.runner import depth_grid
    from ctxlab.eval.suites import get_suite

    monkeypatch.setattr(model_pkg, "load_model", lambda name: loaded)
    suite = get_suite("quick")
    grid = Grid(
        tasks=suite.tasks,
        lengths=suite.lengths,
        depths=depth_grid(suite.depths),
        samples=suite.samples,
        runs=[PolicyRun("full")],
    )
    doc = run_eval(grid, "ctxlab", None, "smollm2-135m", tmp_path, None, None, quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == grid.size()
    shortest = [c for c in doc["cells"] if c["length"] == min(suite.lengths)]
    assert len(shortest) == len(suite.tasks)
    assert sum(c["score"] for c in shortest) / len(shortest) >= QUICK_FLOOR
    single = next(c for c in shortest if c["task"] == "niah_single_noise")
    assert single["score"] == 100.0
    assert (tmp_path / "summary.json").is_file() and doc["plots"]
