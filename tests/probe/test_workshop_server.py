"""`ctxlab workshop --quick` through real servers: llama.cpp's server (a cache nobody here
wrote: one prompt per slot) and `ctxlab serve` (shared pages of 32 tokens), every
demonstration, the servers named in the report, side by side where a config lists both,
and what a server cannot show reported as not measurable with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.probe.conftest import ROOT, ctxlab_serve, llamacpp_serve
from tests.workshop.report_numbers import unmatched

PAGE = 32
POOL = 1024


@pytest.fixture(scope="module")
def llama(serve_model):
    with llamacpp_serve(parallel=2, ctx=4096, cache_ram_mib=0) as url:
        yield url


@pytest.fixture(scope="module")
def paged(serve_model):
    args = ("--page-size", str(PAGE), "--kv-pool-tokens", str(POOL), "--metrics-prefix", "vllm")
    with ctxlab_serve(*args) as url:
        yield url


def workshop(tmp_path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", "from ctxlab.cli import main; main()", "workshop", "--quick",
           *args, "--out", str(tmp_path), "--json"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "complete" and not results["error"]
    assert unmatched(server_part(results), results) == []
    return results


def server_part(results: dict) -> str:
    """The report without the tables the local engine made (demonstration 7's own and the
    eval's: their numbers are the in-process workshop tests' business)."""
    import copy

    from ctxlab.workshop.document import build_document
    from ctxlab.workshop.report_markdown import render_markdown

    doc = copy.deepcopy(results)
    for d in doc["demos"].values():
        d["tables"] = [t for t in d["tables"] if "on the local engine" not in t["title"]]
    doc["useful_context"] = None
    return render_markdown(build_document(doc))


def verdicts(results: dict, demo: int) -> dict[str, dict]:
    return {v["metric"]: v for v in results["verdicts"] if v["demo"] == demo}


def through_chat(results: dict, engine: str) -> None:
    """5 and 6 ran, every model call to the server's chat API, their tables naming it."""
    for key in ("compaction", "retrieval_depth"):
        d = results["demos"][key]
        assert d["status"] == "run"
        assert any("/v1/chat/completions" in n for n in d["notes"])
        assert all(engine in t["title"] for t in d["tables"])


def seven_on_the_server(results: dict) -> None:
    d = results["demos"]["recurrent_vs_kv"]
    (table,) = [t for t in d["tables"] if t["key"] == "recurrent_vs_kv_server"]
    assert [r[0] for r in table["rows"]] == ["short", "long"]
    assert all(r[3] > 0 and r[4] >= r[3] for r in table["rows"])  # TTFT p50 <= p99


@pytest.mark.model
def test_workshop_through_llamacpp_beside_ctxlab_serve(llama, paged, tmp_path):
    config = tmp_path / "servers.toml"
    config.write_text(
        f'[[servers]]\nlabel = "llamacpp"\nurl = "{llama}"\n\n'
        f'[[servers]]\nlabel = "paged"\nurl = "{paged}"\napi_key = "sk-not-needed"\n'
    )
    results = workshop(tmp_path / "out", str(config))
    assert results["server"]["engine"] == "llama.cpp"
    assert "sk-not-needed" not in (tmp_path / "out" / "results.json").read_text()
    demos = results["demos"]
    # 1: a changed token 0 reuses nothing, an exact resend all but the last token, and
    # another cache_salt everything (llama.cpp does not isolate)
    rows = {r[0]: r for r in demos["prefix_miss"]["tables"][0]["rows"]}
    prompt = results["config"]["prefix_miss"]["prompt_tokens"]
    assert rows["cold"][2] == 0 and rows["token 0"][2] == 0
    assert rows["exact resend"][2] == rows["other tenant"][2] == prompt - 1
    assert all("llama.cpp" in t["title"] for t in demos["prefix_miss"]["tables"])
    # 3: not measurable as configured; each server's own page measured, side by side
    three = demos["page_size"]
    assert three["status"] == "not measurable"
    tables = {t["key"]: t for t in three["tables"]}
    side = tables["page_size_servers_reuse"]
    assert [c["name"] for c in side["columns"]] == [
        "diverges at token", "reused on llamacpp", "reused on paged"
    ]  # fmt: skip
    assert all(r[1] == r[0] and r[2] == r[0] // PAGE * PAGE for r in side["rows"])
    assert [r[:2] for r in tables["page_size_servers_waste"]["rows"]] == [
        ["llamacpp", 1], ["paged", PAGE]
    ]  # fmt: skip
    probe = {r[0]: r for r in results["servers_table"]["rows"]}
    assert probe["llamacpp"][6] == 1 and probe["paged"][6] == PAGE
    assert probe["llamacpp"][8] == "no" and probe["paged"][8] == "yes"  # cache_salt isolates
    # 4: sized to whole prompts per slot (2 slots keep 2 prompts), measured and predicted
    four = demos["eviction"]
    assert four["status"] == "run" and four["figures"]["capacity_kept"] == 2
    assert four["figures"]["groups"] >= 4
    assert (tmp_path / "out" / "eviction-prediction.json").exists()
    v4 = verdicts(results, 4)
    assert v4["evictions"]["verdict"] == "not measurable"
    assert v4["reused_tokens"]["verdict"] in ("held", "failed")
    through_chat(results, "llama.cpp")
    seven_on_the_server(results)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "server: llama.cpp" in report and "paged: ctxlab at" in report


@pytest.mark.model
def test_workshop_through_ctxlab_serve(paged, tmp_path):
    # The demonstrations this test reads (2 and 3 through a server, 8 and 9 on the local
    # engine are the test above's and the in-process run's): the suite stays inside CI's time.
    results = workshop(tmp_path, "--server", paged, "--only", "1,4,5,6,7")
    assert results["server"]["engine"] == "ctxlab"
    demos = results["demos"]
    rows = {r[0]: r for r in demos["prefix_miss"]["tables"][0]["rows"]}
    prompt = results["config"]["prefix_miss"]["prompt_tokens"]
    whole = (prompt - 1) // PAGE * PAGE
    assert rows["exact resend"][2] == whole and rows["other tenant"][2] == 0
    # 4: the cache measured to the page, prefixes sized past it, the interleaved order
    # evicting: it reuses less than the grouped one
    four = demos["eviction"]
    assert four["status"] == "run"
    assert abs(four["figures"]["capacity_kept"] - POOL) <= PAGE
    working = four["figures"]["groups"] * four["figures"]["prefix_tokens"]
    assert working > POOL
    obs = four["observations"]["reused_tokens"]
    assert obs["observed"] < obs["baseline"]
    assert four["figures"]["prediction_lead_ms"] >= 0  # written before the first request
    ttft = verdicts(results, 4)["sim_vs_engine_ttft_p50_ms"]
    assert ttft["verdict"] in ("held", "failed", "within noise") and ttft["samples"]
    through_chat(results, "ctxlab")
    seven_on_the_server(results)
