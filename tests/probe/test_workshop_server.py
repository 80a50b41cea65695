"""`ctxlab workshop --server URL`: demonstrations measured through llama.cpp's server (a
cache nobody here wrote), the server named in the report, and what a server cannot show
reported as not measurable with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.probe.conftest import ROOT, llamacpp_serve
from tests.workshop.report_numbers import unmatched


@pytest.fixture(scope="module")
def llama(serve_model):
    with llamacpp_serve(parallel=2, ctx=4096, cache_ram_mib=0) as url:
        yield url


@pytest.mark.model
def test_workshop_through_llamacpp(llama, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", "from ctxlab.cli import main; main()", "workshop", "--quick",
           "--server", llama, "--only", "1,3,4", "--out", str(tmp_path), "--json"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["server"]["engine"] == "llama.cpp"
    assert results["status"] == "complete"
    demos = results["demos"]
    # 1: through the server; a changed token 0 reuses nothing, an exact resend all but the
    # last token, and another cache_salt reuses everything (llama.cpp does not isolate)
    rows = {r[0]: r for r in demos["prefix_miss"]["tables"][0]["rows"]}
    prompt = results["config"]["prefix_miss"]["prompt_tokens"]
    assert rows["cold"][2] == 0
    assert rows["token 0"][2] == 0
    assert rows["exact resend"][2] == prompt - 1
    assert rows["other tenant"][2] == prompt - 1
    assert all("llama.cpp" in t["title"] for t in demos["prefix_miss"]["tables"])
    # 3: page sizes cannot be set on a server (not measurable); its own page is measured
    assert demos["page_size"]["status"] == "not measurable"
    reuse = demos["page_size"]["tables"][0]
    assert all(r[2] == r[0] for r in reuse["rows"])  # reused = divergence position
    # 4: not measurable through a server, with the reason in every verdict
    assert demos["eviction"]["status"] == "not measurable"
    four = [v for v in results["verdicts"] if v["demo"] == 4]
    assert four and all(v["verdict"] == "not measurable" for v in four)
    report = (tmp_path / "report.md").read_text()
    assert "server: llama.cpp" in report
    assert unmatched(report, results) == []  # every printed number is stored (a port is not)
