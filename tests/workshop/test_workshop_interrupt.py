"""SIGINT of the workshop: the finished demonstrations stay in the report, which says
"interrupted"; interrupted before any report, the older one in --out is marked; exit 130,
documented in --help. The demonstrations are stood in for (the runner's handling is what is
tested), so no demonstration runs."""

from __future__ import annotations

import json
import os

import pytest

from ctxlab.workshop.registry import REGISTERED
from ctxlab.workshop.result import DemoResult
from tests.cli.conftest import run_in_process


def _stand_in(stop_at: int):
    """A `_one_demo` that finishes every demonstration before `stop_at` and is interrupted
    in it (as Ctrl-C would)."""

    def one(session, demo, show, through, server_part_only=False):
        if demo.number == stop_at:
            raise KeyboardInterrupt
        res = DemoResult.of(demo, "run")
        res.summary = f"stand-in for {demo.title}"
        return res

    return one


@pytest.mark.model
def test_interrupted_run_keeps_finished_demonstrations(loaded, tmp_path, monkeypatch):
    from ctxlab.workshop import runner
    from ctxlab.workshop.config_file import load_config

    monkeypatch.setattr(runner, "_one_demo", _stand_in(3))
    # the stand-ins have no figures for their guards to cite: the checklist is not tested here
    monkeypatch.setattr(runner.checklist, "evaluate", lambda results: [])
    cfg = load_config(quick=True)
    res = runner.run_workshop(cfg, tmp_path, loaded=loaded, show_progress=False)
    status = {d["number"]: d["status"] for d in res["demos"].values()}
    assert status[1] == status[2] == "run"
    assert all(status[d.number] == "interrupted" for d in REGISTERED if d.number >= 3)
    assert res["status"] == "interrupted" and res["interrupted"] == "in demonstration 3"
    assert res["useful_context"] is None  # the eval does not start after SIGINT
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "**Status: INTERRUPTED**" in report and "2 finished demonstration(s)" in report
    assert "stand-in for" in report  # the finished ones' summaries are kept
    stored = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert stored["status"] == "interrupted"


def test_interrupt_before_the_report_marks_the_older_one(tmp_path, monkeypatch, capsys):
    from ctxlab.commands import workshop

    old = tmp_path / "report.md"
    old.write_text("# ctxlab workshop report\n\n**Status: complete**\n", encoding="utf-8")
    os.utime(old, (1_000_000_000, 1_000_000_000))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(workshop, "_run", interrupted)
    got = run_in_process(monkeypatch, capsys, "workshop", "--only", "1", "--out", str(tmp_path))
    assert got.code == 130
    assert got.err_lines == [
        f"error: interrupted (SIGINT) before the run wrote its report; the older report in "
        f"{tmp_path} is marked as such."
    ]
    text = old.read_text(encoding="utf-8")
    assert text.startswith("> **Superseded**: a later run in this folder")
    assert text.endswith("**Status: complete**\n")  # the old report itself is kept


def test_help_documents_the_exit_codes(monkeypatch, capsys):
    got = run_in_process(monkeypatch, capsys, "workshop", "--help")
    assert got.code == 0
    text = " ".join(got.out.split())
    assert "130 interrupted" in text and "3 a server stopped answering" in text
