"""The probe against vLLM, the reference deployment (the session's `vllm_server`: SmolLM2,
128-token CPU blocks, a 48-block pool, prefix caching, prompt-token details). What the probe
reports is checked against how vLLM was started; skipped with the `make vllm` hint where
vLLM's CPU build is not installed."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli.conftest import run_in_process
from tests.vllm_server import VLLM, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.server, pytest.mark.xdist_group(VLLM)]


def _log(server: VllmServer) -> str:
    """vLLM's start-up log ('' for a server started by hand: its log is not ours)."""
    try:
        return server.log.read_text(errors="replace")
    except OSError:
        return ""


def _figures(doc: dict, section: str) -> dict[str, dict]:
    return {f["name"]: f for f in doc["sections"][section]}


def test_probe_finds_vllm_page_isolation_and_pool(
    vllm_server: VllmServer, monkeypatch, capsys, tmp_path
):
    out = tmp_path / "probe.json"
    events = ("--kv-events", vllm_server.kv_events) if vllm_server.kv_events else ()
    r = run_in_process(
        monkeypatch, capsys, "probe", "--server", vllm_server.url, "--yes", "--out", str(out),
        "--sections", "prefix,isolation,capacity", "--longest", "300",
        "--max-seconds", "7200",  # not the 900 s default: a loaded 2-core box took 18 minutes
        *events,
    )  # fmt: skip
    assert r.code == 0, r.err
    doc = json.loads(out.read_text())
    assert doc["server"]["engine"] == "vllm" and doc["server"]["model"] == vllm_server.model

    pre = _figures(doc, "prefix caching")
    assert pre["prefix caching"]["value"] is True
    assert pre["cache granularity"]["value"] == vllm_server.block_size
    assert pre["cache granularity"]["how"] == "measured"
    page = vllm_server.block_size
    assert all(p["cached"] == p["position"] // page * page for p in doc["details"]["staircase"])

    iso = _figures(doc, "isolation")["cache_salt isolates"]
    assert iso["value"] is True and iso["how"] == "measured", iso
    reused = doc["details"]["isolation"]
    assert reused["same salt"] >= 2 * page  # the prompt holds two whole pages and a tail
    assert reused["other salt"] == 0 and reused["no salt"] == 0

    cap = _figures(doc, "capacity")
    pub = cap["capacity published in /metrics"]
    assert pub["value"] == vllm_server.pool_tokens and "vllm:cache_config_info" in pub["note"]
    got = cap["prefix-cache capacity"]
    assert got["how"] == "measured", got
    assert abs(got["value"] - vllm_server.pool_tokens) <= page  # vLLM keeps one null block
    assert len(doc["details"]["capacity trials"]) <= 2  # confirmed, not searched
    assert "requests" in cap["sent by the capacity section"]["value"]
    assert "sent by the capacity section" in r.out

    # the planner's prediction from what vLLM publishes: its folder's config.json (float32),
    # block 128, max_model_len 2048 and the pool the block override sets
    predicted = cap["capacity predicted by the planner"]
    assert predicted["value"] == vllm_server.pool_tokens, predicted
    assert "num_gpu_blocks_override" in predicted["note"]
    logged = re.search(r"Overriding num_gpu_blocks=(\d+)", _log(vllm_server))
    if logged:  # the pool's own block count, before the override: vLLM's log against ours
        assert f"alone give {logged.group(1)} blocks" in predicted["note"]
    blocks = vllm_server.pool_tokens // page
    assert cap["num_gpu_blocks predicted / published"]["value"] == f"{blocks} / {blocks}"
    assert doc["details"]["engine pool"]["num_blocks"] == blocks
    verdict = cap["capacity: which figure disagrees"]
    assert verdict["value"] == "none", verdict
    assert "capacity, predicted / published / measured: the predicted, published" in r.out

    if vllm_server.kv_events:  # the capacity again, from vLLM's own KV events
        from_events = cap["capacity from KV events"]
        assert from_events["how"] == "measured", from_events
        assert abs(from_events["value"] - vllm_server.pool_tokens) <= page
        residency = json.loads((tmp_path / "probe-residency.json").read_text())
        assert residency["summary"]["block_size"] == page and residency["evictions"]
        assert (tmp_path / "probe-residency.png").is_file()


def test_a_model_vllm_does_not_serve_is_one_sentence(
    vllm_server: VllmServer, monkeypatch, capsys, tmp_path
):
    r = run_in_process(
        monkeypatch, capsys, "probe", "--server", vllm_server.url, "--model", "no-such-model",
        "--yes", "--out", str(tmp_path / "p.json"),
    )  # fmt: skip
    assert r.code == 2
    assert len(r.err_lines) == 1 and "does not serve model 'no-such-model'" in r.err
