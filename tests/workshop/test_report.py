"""The report: every number in report.md is in results.json, the HTML stands alone, the
tables name their layers, the six context numbers and the checklist are all there."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from report_numbers import printed_numbers, unmatched

from tests.cli.conftest import Result, run_in_process

pytestmark = pytest.mark.model


def test_every_number_in_the_markdown_is_in_results_json(tiny_run) -> None:
    _, out = tiny_run
    text = (out / "report.md").read_text()
    doc = json.loads((out / "results.json").read_text())
    assert len(printed_numbers(text)) > 200
    assert unmatched(text, doc) == []


def test_the_number_check_can_fail() -> None:
    doc = {"a": 1234.46, "b": [7, 0.5]}
    assert unmatched("1,234.5 ms, 7 and 0.50", doc) == []
    assert unmatched("1,234.6 ms", doc) == ["1,234.6"]
    assert unmatched("p99 of llama-3.1-8b in `plots/4_x.png` is 8", doc) == ["8"]
    # a dotted version is not a figure; a number that ends a sentence still is
    assert unmatched("through vllm 0.32.0 at a URL, 0.50. Then 8.", doc) == ["8"]
    # a negative figure is read with its sign (it was never read at all)
    assert printed_numbers("a change of -18.8 points [-1.5, 2]") == ["-18.8", "-1.5", "2"]
    assert unmatched("changed by -7", doc) == ["-7"]


def test_html_is_self_contained(tiny_run) -> None:
    results, out = tiny_run
    html = (out / "report.html").read_text()
    assert not re.search(r"(src|href)=\"https?:", html)
    plots = [p for d in results["demos"].values() for p in d["plots"]]
    assert len(plots) >= 4
    assert html.count('src="data:image/png;base64,') == len(plots)
    for p in plots:
        assert (out / p).read_bytes()[:4] == b"\x89PNG"


def test_tables_name_their_layer_and_mode(tiny_run) -> None:
    results, out = tiny_run
    text = (out / "report.md").read_text()
    for layer in ("Storage", "Serving", "Retrieval", "Task", "Cost"):
        assert f"## {layer} results" in text
    for d in results["demos"].values():
        for t in d["tables"]:
            assert t["layer"] in ("storage", "serving", "retrieval", "task", "cost")
            assert f"{t['title']} ({t['mode']})" in text


def test_six_context_numbers_and_the_checklist(tiny_run) -> None:
    results, _ = tiny_run
    names = [r["name"] for r in results["context_numbers"]]
    assert names == [
        "advertised window",
        "configured maximum length",
        "prompt budget after reserved output",
        "resident cache tokens",
        "retrieved tokens",
        "measured useful context",
    ]
    assert len(results["checklist"]) == 14
    statuses = {c["status"] for c in results["checklist"]}
    assert statuses <= {"guarded", "partly guarded", "not exercised"}
    by_risk = {c["risk"]: c for c in results["checklist"]}
    assert by_risk["cross-tenant reuse without an isolation key"]["status"] == "guarded"


def test_every_gain_is_explained_twice_or_says_it_is_not(tiny_run) -> None:
    _, out = tiny_run
    text = (out / "report.md").read_text()
    gains = [line for line in text.splitlines() if line.startswith("- **")]
    assert gains
    for line in gains:
        assert "Storage: " in line and "Product: " in line
    assert "has not established a decision in product terms" in text


def run_cli(monkeypatch, capsys, *args: str, cwd: Path) -> Result:
    """`ctxlab workshop ARGS` through `main()` in this process, in `cwd` (a fresh process
    of the workshop/tour family: tests/plan/test_plan_cli.py's tour)."""
    with monkeypatch.context() as mp:
        mp.chdir(cwd)
        return run_in_process(mp, capsys, "workshop", *args)


def test_cli_mistakes_exit_2_with_one_sentence(tmp_path: Path, monkeypatch, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine]\npage_size = 0\n")
    r = run_cli(monkeypatch, capsys, str(bad), cwd=tmp_path)
    assert r.code == 2 and r.err.startswith("error: ") and r.err.count("\n") == 1
    assert "engine.page_size" in r.err and str(bad) in r.err
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    r = run_cli(monkeypatch, capsys, "--out", str(a_file), cwd=tmp_path)
    assert r.code == 2 and "is a file" in r.err
    r = run_cli(monkeypatch, capsys, "--only", "1,42", cwd=tmp_path)
    assert r.code == 2 and "not a demonstration number" in r.err
    r = run_cli(monkeypatch, capsys, "--print-config", cwd=tmp_path)
    assert r.code == 0 and "[predictions.warm_prefix]" in r.out


def test_the_report_opens_with_a_summary_that_follows_the_run(tiny_run) -> None:
    """Issue 33's README walk: the report opens with what was decided (the verdict counts and
    the run's status), on what (CPU, cores, ctxlab version and commit, torch, the engine), and
    the status line below it says the same status as results.json."""
    results, out = tiny_run
    text = (out / "report.md").read_text(encoding="utf-8")
    head = text.split("## Predictions against observations")[0]
    assert head.index("## Summary") < head.index("**Status")
    counts = results["verdict_counts"]
    assert f"{counts['held']} held, {counts['failed']} failed" in head
    assert f"the run is {results['status']}." in head
    run = results["run"]
    assert f"({run['cores']} cores," in head and "at commit `" in head and "torch `" in head
    status = "complete" if results["status"] == "complete" else results["status"].upper()
    assert f"**Status: {status}**" in head


def test_the_headline_figures_are_measured_values(tiny_run) -> None:
    """Each demonstration's headline line starts with what was measured: every metric the
    config requires of it that has both values, baseline -> observed as results.json holds
    them, with its verdict (a line that described the workload alone told a reader nothing
    the run found)."""
    from ctxlab.workshop.result import fmt, is_number

    results, out = tiny_run
    text = (out / "report.md").read_text(encoding="utf-8")
    head = text.split("**Status")[0]
    verdicts = {(v["key"], v["metric"]): v["verdict"] for v in results["verdicts"]}
    shown = 0
    for ref in results["config"]["required_metrics"]:
        key, _, name = ref.partition(".")
        demo = results["demos"].get(key)
        if demo is None or demo["status"] != "run" or not demo["summary"]:
            continue
        o = demo["observations"].get(name)
        if o is None or not all(is_number(o[k]) for k in ("baseline", "observed")):
            continue
        line = next(x for x in head.splitlines() if x.startswith(f"- {demo['number']}. "))
        figure = f"{name} {fmt(o['baseline'], o['digits'])} -> {fmt(o['observed'], o['digits'])}"
        assert figure in line, (figure, line)
        if (key, name) in verdicts:
            assert f"{figure} ({verdicts[key, name]})" in line
        shown += 1
    assert shown >= 5  # the tiny run measures most of what the default config requires
