from __future__ import annotations

import json

from typer.testing import CliRunner

from ctxlab.cli import app


def test_policies_table_and_json():
    runner = CliRunner()
    res = runner.invoke(app, ["policies"])
    assert res.exit_code == 0, res.output
    for name in ("snapkv", "streaming", "h2o", "quest", "quant", "recall", "bigbird"):
        assert name in res.output
    res = runner.invoke(app, ["policies", "--json"])
    assert res.exit_code == 0
    rows = {r["name"]: r for r in json.loads(res.output)["policies"]}
    assert rows["snapkv"]["params"]["kernel"] == 7
    assert rows["quest"]["layer"] == "selection"
    assert all(r["in_engine"] for r in rows.values())
    assert rows["quant"]["layer"] == "storage" and rows["quant"]["params"]["fmt"] == "kivi4"
    res = runner.invoke(app, ["policies"])
    assert "--kv-format" in res.output


def test_docs_show_the_table_the_command_prints():
    """docs/policies.md shows `ctxlab policies` verbatim, so a new policy or default shows."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "policies.md").read_text()
    printed = CliRunner().invoke(app, ["policies"]).output
    table = "\n".join(line.rstrip() for line in printed.strip("\n").splitlines())
    assert f"$ ctxlab policies\n{table}\n```" in doc, "regenerate the table in docs/policies.md"
