"""Each split demonstration's `measure`, run at tiny sizes: it returns frozen records with no
string formatted for the report (`plain_records.problems`), and the records carry the
counts its tables and verdicts read."""

from __future__ import annotations

import importlib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from plain_records import FOLLOWUP_TEXTS, LONG_TEXTS, problems, type_problems

from ctxlab.progress import progress
from ctxlab.workshop.registry import REGISTERED


def _measure(module, session):
    with progress("measure", enabled=False) as tracker:
        return module.measure(session, tracker)


@dataclass(frozen=True)
class Fine:
    label: Literal["a", "b"]
    n: int
    xs: tuple[float, ...]


@dataclass
class Loose:
    said: str
    xs: list[int]


def test_the_rule_finds_what_it_forbids() -> None:
    assert problems(Fine("a", 1, (1.0, 2.0))) == []
    found = problems((Fine("b", 2, ()), Loose("1,024 ms", [1])))
    assert len(found) == 3
    assert any("Loose is not frozen" in p for p in found)
    assert any("said" in p and "not a Literal" in p for p in found)
    assert any("xs: a mutable list" in p for p in found)
    assert problems(Loose("an answer", []), texts=frozenset({"said"}))[1:] == [
        "measure.Loose.xs: a mutable list"
    ]
    assert type_problems(tuple[Fine, ...]) == []
    found = type_problems(Loose)
    assert "Loose is not frozen" in found and len(found) == 3  # and its str, its list


def test_prefix_miss_measures_frozen_records(session) -> None:
    from ctxlab.workshop import demo_prefix_miss as demo

    r = _measure(demo, session)
    assert problems(r) == []
    assert [c.case for c in r.cases] == [
        "cold", "exact resend", "token 0", "middle", "last block", "other tenant"
    ]  # fmt: skip
    assert r["token 0"].reused == 0 and r["token 0"].position == 0
    assert r["middle"].reused == r["middle"].position == 32  # 64 tokens, page 16
    assert r["other tenant"].reused == 0
    assert all(len(c.sent) == 1 for c in r.cases)  # repeats = 1 in the tiny config


def test_warm_prefix_measures_frozen_records(session) -> None:
    from ctxlab.workshop import demo_warm_prefix as demo

    r = _measure(demo, session)
    assert problems(r) == []
    assert (r.cold.side, r.warm.side) == ("cold", "warm")
    assert r.cold.n == r.warm.n == 3  # repeats in the tiny config
    assert r.cold.reused == 0 and r.warm.reused == 64  # the 64-token prefix, whole pages
    assert r.warm.recomputed == 16 and r.cold.prompt == 80
    assert len(r.warm.itl_ms) == 3 * 3  # 4 output tokens: 3 gaps per request
    assert r.slot_bytes > 0


def test_page_size_measures_frozen_records(session) -> None:
    from ctxlab.workshop import demo_page_size as demo

    r = _measure(demo, session)
    assert problems(r) == []
    assert [row.page for row in r.rows] == [1, 16, 64]
    assert r.lo.waste == 0 and r.rows[1].waste == (48 - 40) + (112 - 100)  # pages of 16
    assert [row.reused for row in r.rows] == [70, 64, 64]  # whole pages before token 70
    assert all(row.reused == row.reused_plan and row.waste == row.waste_plan for row in r.rows)


def test_eviction_measures_frozen_records(session) -> None:
    from ctxlab.workshop import demo_eviction as demo

    r = _measure(demo, session)
    assert problems(r, frozenset({"file_label"})) == []
    assert r.profile.source == "measured" and r.profile.steps
    g, i = r.grouped.engine, r.interleaved.engine
    assert len(g.ttft_ms) == len(i.ttft_ms) == 6  # 3 groups x 2 requests
    assert g.reused > i.reused and i.evictions > 0
    assert r.unique == 3 * 64 + 6 * 16 and r.working == 3 * 64


def test_offload_measures_frozen_records(session) -> None:
    from ctxlab.workshop import demo_offload as demo

    r = _measure(demo, session)
    assert problems(r, frozenset({"file_label"})) == []
    assert r.profile is not None and r.profile.source == "measured"  # no demonstration 4 ran
    restored = r.tier_counts.restored_tokens
    assert restored > 0 and restored % 16 == 0  # whole pages of the prefixes
    assert r.tier.reused >= r.no_tier.reused + restored  # every restored token is reused
    assert r.tier.recomputed(r.unique) < r.no_tier.recomputed(r.unique)
    assert len(r.no_tier.ttft_ms) == 6 and r.failure.tokens == 6 * 2  # 3 groups x 2, 2 out
    assert r.failure.wrong == 0 and r.failure.injected.total >= 1
    assert r.failure.tier.restore_failures.total == r.failure.injected.total
    assert r.sim_tier.transfer_bytes > 0 and r.sim_no_tier.transfer_bytes == 0


def test_retrieval_depth_measures_frozen_records(session) -> None:
    from ctxlab.workshop import demo_retrieval_depth as demo

    r = _measure(demo, session)
    assert problems(r) == []
    assert [d.k for d in r.depths] == [1, 2] and (r.questions, r.answered) == (20, 4)
    assert all(len(d.recalls) == 20 and len(d.correct) == 4 for d in r.depths)
    assert r.hi.recall >= r.lo.recall  # the top 2 hold the top 1
    assert r.hi.retrieved_tokens > r.lo.retrieved_tokens > 0
    assert r.gold is not None and len(r.gold.correct) == 4 and r.gold.recalls == ()
    assert r.documents > 0 and r.chunks >= r.documents


# Fields that hold text the run produced rather than a label or a formatted number.
TEXTS: dict[str, frozenset[str]] = {
    "compaction": frozenset({"id"}),  # a planted fact's name, as the fixture wrote it
    "eviction": frozenset({"file_label"}),  # a named step-profile file's own label
    "offload": frozenset({"file_label"}),  # the same profile (demonstration 4's workload)
    "followup": FOLLOWUP_TEXTS,  # a document, a fact's name and number
    "long_vs_retrieval": LONG_TEXTS,  # a gold question's id, the model's answer
}


@pytest.mark.parametrize("demo", REGISTERED, ids=[d.key for d in REGISTERED])
def test_every_measure_is_typed_to_return_frozen_records(demo) -> None:
    """Every registered demonstration's `measure`, read from its return type, so one whose
    run is costly (two processes, a simulator, a second model, a conversation replayed per
    strategy) is held to the rule too; the tiny runs above cover behaviour."""
    module = importlib.import_module(demo.run.__module__)
    measure = getattr(module, "measure", None)
    assert measure is not None, f"{module.__name__} has no measure(session, tracker)"
    returned = typing.get_type_hints(measure)["return"]
    assert type_problems(returned, TEXTS.get(demo.key, frozenset())) == []


def test_the_text_fields_name_registered_demonstrations() -> None:
    assert set(TEXTS) <= {d.key for d in REGISTERED}


def test_offload_reuses_only_a_step_profile_written_in_this_run(
    tiny_config: Path, tmp_path: Path, monkeypatch
) -> None:
    """Demonstration 8 reuses demonstration 4's step profile only when this run wrote it
    (the session's start, not the process's: no model needed)."""
    import os

    from ctxlab.workshop import demo_offload
    from ctxlab.workshop import eviction_workload as workload
    from ctxlab.workshop.config_file import load_config
    from ctxlab.workshop.eviction_workload import StepProfile
    from ctxlab.workshop.session import Session

    measured = StepProfile("measured", steps=1, seconds=0.5)
    monkeypatch.setattr(workload, "step_profile", lambda session, ev: measured)
    session = Session(load_config(tiny_config), None, tmp_path)  # type: ignore[arg-type]
    assert demo_offload._step_profile(session) is measured  # no file: measured now
    path = tmp_path / "step-profile.json"
    path.write_text("{}\n", encoding="utf-8")
    os.utime(path, (session.started - 60, session.started - 60))
    assert demo_offload._step_profile(session) is measured  # an older run's file
    os.utime(path, (session.started + 1, session.started + 1))
    assert demo_offload._step_profile(session) is None  # this run's: demonstration 4's
