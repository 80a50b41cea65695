"""The registry of demonstrations: every declaration is checked here, so a new demonstration
that misspells a metric, forgets a default table or guards an unknown risk fails a test, not
a report (no model needed)."""

from __future__ import annotations

import tomllib

import pytest
from pydantic import BaseModel

from ctxlab.workshop import checklist
from ctxlab.workshop.config_file import load_config
from ctxlab.workshop.default_config import DEFAULT_TOML
from ctxlab.workshop.demonstration import Demonstration, Risk
from ctxlab.workshop.registry import BY_KEY, REGISTERED, WorkshopConfig
from ctxlab.workshop.result import DemoResult

UNITS = {"tokens", "ms", "bytes", "requests", "%", "USD", "blocks", "facts", "s", "MiB"}
IDS = [d.key for d in REGISTERED]


def test_numbers_run_one_to_n_with_distinct_keys() -> None:
    assert [d.number for d in REGISTERED] == list(range(1, len(REGISTERED) + 1))
    assert len(BY_KEY) == len(REGISTERED)


@pytest.mark.parametrize("demo", REGISTERED, ids=IDS)
def test_its_table_is_in_the_schema_and_the_default(demo: Demonstration[BaseModel]) -> None:
    assert WorkshopConfig.model_fields[demo.key].annotation is demo.section
    default = tomllib.loads(DEFAULT_TOML)
    assert demo.key in default and demo.key in default["predictions"]
    assert isinstance(demo.config(load_config()), demo.section)
    assert isinstance(demo.config(load_config(quick=True)), demo.section)
    # its fragments are whole TOML tables of its own key and nothing else
    own = tomllib.loads(demo.toml + demo.predictions_toml + demo.quick_toml)
    assert set(own) <= {demo.key, "predictions", "quick"}
    assert set(own["predictions"]) == {demo.key}
    assert set(own.get("quick", {})) <= {demo.key, "predictions"}


@pytest.mark.parametrize("demo", REGISTERED, ids=IDS)
def test_its_metrics_are_distinct_with_known_units(demo: Demonstration[BaseModel]) -> None:
    names = demo.metric_names
    assert len(set(names)) == len(names)
    for metric in demo.metrics:
        assert metric.unit in UNITS, (demo.key, metric.name, metric.unit)
        assert metric.baseline and metric.observed and metric.description
    default = load_config()
    assert set(default.predictions[demo.key]) <= set(names)
    assert {f"{demo.key}.{m}" for m in demo.required} <= set(default.required_metrics)


@pytest.mark.parametrize("demo", REGISTERED, ids=IDS)
def test_a_misspelt_metric_is_refused_when_observed(demo: Demonstration[BaseModel]) -> None:
    result = DemoResult.of(demo)
    result.observe(demo.metric_names[0], 1, 2)
    with pytest.raises(ValueError, match="not a declared metric"):
        result.observe(demo.metric_names[0] + "_typo", 1, 2)


@pytest.mark.parametrize("demo", REGISTERED, ids=IDS)
def test_its_guards_name_risks_of_the_list(demo: Demonstration[BaseModel]) -> None:
    for risk, guard in demo.guards:
        assert isinstance(risk, Risk) and callable(guard)


def test_a_risk_whose_demonstration_did_not_run_says_which() -> None:
    results = {
        "demos": {d.key: {"status": "not selected"} for d in REGISTERED},
        "context_numbers": [
            {"name": "configured maximum length", "tokens": 4096},
            {"name": "measured useful context", "tokens": None},
        ],
        "useful_context": None,
    }
    items = {row["risk"]: row for row in checklist.evaluate(results)}
    assert list(items) == [r.value for r in Risk]
    for demo in REGISTERED:
        for risk, _ in demo.guards:
            if risk in checklist.STRUCTURAL:
                continue
            assert items[risk.value]["status"] == "not exercised"
            assert f"demonstration {demo.number} was not selected" in items[risk.value]["how"]


def test_each_table_of_the_tiny_run_is_in_a_declared_layer(tiny_run) -> None:
    """The run's tables go where their demonstration says, and a demonstration reports every
    metric it declares as required."""
    results, _ = tiny_run
    for key, demo in results["demos"].items():
        if demo["status"] != "run":
            continue
        layers = {t["layer"] for t in demo["tables"]}
        assert layers <= set(BY_KEY[key].layers), (key, layers)
        assert set(demo["observations"]) <= set(BY_KEY[key].metric_names)
        assert set(BY_KEY[key].required) <= set(demo["observations"])
