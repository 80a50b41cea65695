"""Demonstration 10 (the question after compression): its rows read from the shared tiny run,
and its declarations without a model."""

from __future__ import annotations

from typing import Any

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.workshop import demo_followup
from ctxlab.workshop.config_file import load_config


def _table(results: dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    """A table of the tiny run's demonstration 10 as setting -> {column: cell}."""
    demo = results["demos"]["followup"]
    (table,) = [t for t in demo["tables"] if t["key"] == key]
    names = [c["name"] for c in table["columns"]]
    return {row[0]: dict(zip(names, row, strict=True)) for row in table["rows"]}


@pytest.mark.model
def test_every_row_is_paired_with_the_full_cache_over_the_same_questions(tiny_run) -> None:
    results, _ = tiny_run
    assert results["demos"]["followup"]["status"] == "run"
    task = _table(results, "followup_task")
    full, fresh = task["full cache"], task["fresh prefill per question"]
    c = demo_followup.FollowupSection.model_validate(results["config"]["followup"])
    from ctxlab.workshop.followup_report import label

    settings = [label(s, c) for s, _, _ in demo_followup.settings(c)]
    assert set(task) == {"full cache", "fresh prefill per question", *settings}
    # no loss either way: the held full cache answers the follow-ups at least as often as
    # the fresh prefill it is paired with, to within the run's noise
    change = fresh["follow-ups vs full cache, points"]
    assert change == pytest.approx(fresh["follow-ups %"] - full["follow-ups %"])
    assert fresh["paired 95 % low"] <= change <= fresh["paired 95 % high"]
    assert full["follow-ups %"] >= fresh["follow-ups %"] or fresh["paired 95 % low"] <= 0


@pytest.mark.model
def test_a_budget_under_the_document_really_evicts(tiny_run) -> None:
    results, _ = tiny_run
    storage = _table(results, "followup_storage")
    full = storage["full cache"]["KiB after question 1"]
    for setting, row in storage.items():
        if setting in ("full cache", "fresh prefill per question"):
            assert row["KiB after question 1"] == pytest.approx(full)
        else:  # measured from the pool's blocks: less is held, not masked
            assert 0 < row["KiB after question 1"] < full, setting
    recall = next(r for s, r in storage.items() if s.startswith("recall("))
    assert recall["far tier: KiB sent out"] > 0  # what recall's base evicted went far
    obs = results["demos"]["followup"]["observations"]["kv_bytes_resident"]
    assert obs["observed"] < obs["baseline"]


@pytest.mark.model
def test_the_follow_up_runs_on_the_held_cache_not_a_new_prefill(tiny_run) -> None:
    results, _ = tiny_run
    serving = _table(results, "followup_serving")
    doc = serving["fresh prefill per question"]["prompt tokens computed per follow-up"]
    full = serving["full cache"]["prompt tokens computed per follow-up"]
    assert full < doc / 2  # the new turn's tokens only
    for setting, row in serving.items():
        if setting != "fresh prefill per question":
            # every compressed row computes what the full cache computes: the turn (give or
            # take the end-of-turn token an answer that stopped already holds)
            assert abs(row["prompt tokens computed per follow-up"] - full) <= 2, setting
            assert row["preemptions"] == 0


def test_policies_are_classed_by_what_they_observe() -> None:
    from ctxlab.policy.registry import POLICIES

    kinds = {n: demo_followup.kind_of(POLICIES[n].needs) for n in ("snapkv", "h2o", "tova")}
    assert set(kinds.values()) == {"query-aware"}
    assert demo_followup.kind_of(POLICIES["keydiff"].needs) == "key-based"
    assert demo_followup.kind_of(POLICIES["streaming"].needs) == "positional"
    assert demo_followup.kind_of(POLICIES["window"].needs) == "positional"


def test_a_bad_section_is_refused() -> None:
    c = load_config().followup
    with pytest.raises(ValueError, match="decreasing"):
        type(c).model_validate({**c.model_dump(), "budgets": [0.25, 0.5]})
    with pytest.raises(ValueError, match="not a policy"):
        type(c).model_validate({**c.model_dump(), "policies": ["snapkv", "nosuch"]})
    with pytest.raises(CtxlabError, match="not a retention policy that evicts"):
        demo_followup._preflight(c.model_copy(update=dict(policies=["quest"])))
    with pytest.raises(CtxlabError, match="too small for recall"):
        demo_followup._preflight(c.model_copy(update=dict(recall_tokens=32)))


def test_through_a_server_it_is_not_measurable_with_the_reason() -> None:
    mode = demo_followup.DEMO.server
    assert mode.variant is not None and mode.uses_server
    res = mode.variant(None, None)  # type: ignore[arg-type]
    assert res.status == "not measurable"
    assert "retention policy" in res.summary and "compressed cache" in res.summary


@pytest.mark.model
def test_a_follow_up_turn_uses_the_chat_templates_own_markers(loaded) -> None:
    tok = loaded.tokenizer
    end, opening = demo_followup.turn_markers(tok)
    assert "user" in end and "assistant" in opening
    facts = (
        demo_followup.Fact("amber-otter", "1234", 0.2),
        demo_followup.Fact("calm-raven", "5678", 0.8),
    )
    doc = demo_followup.Doc("x", facts)
    first = demo_followup.first_turn(tok, doc)
    # the first turn ends with the answer's first words: its key sits in the observation window
    assert "amber-otter" in tok.decode(first[-16:])


def test_policies_a_windowed_model_refuses_make_it_not_measurable(gemma_path, tmp_path) -> None:
    """On Gemma 3 (sliding-window layers) the default's streaming and recall cannot run: the
    demonstration says so, with what to change, before any engine is built (it was the
    engine's refusal, which ended the whole workshop run)."""
    from types import SimpleNamespace

    from ctxlab.model.registry import resolve_model_path

    cfg = load_config()
    c = cfg.followup
    why = demo_followup.refused_here(gemma_path, c)
    assert why is not None
    assert "leave streaming out of followup.policies" in why
    assert "set followup.recall_tokens = 0" in why
    fine = c.model_copy(update=dict(policies=["snapkv", "window"], recall_tokens=0))
    assert demo_followup.refused_here(gemma_path, fine) is None
    assert demo_followup.refused_here(resolve_model_path("smollm2-135m"), c) is None
    session = SimpleNamespace(cfg=cfg, loaded=SimpleNamespace(source_path=gemma_path))
    res = demo_followup.run(session, None)  # type: ignore[arg-type]
    assert res.status == "not measurable" and "sliding-window layers" in res.summary
