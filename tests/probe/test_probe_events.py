"""`ctxlab probe --kv-events`: the capacity confirmed from the server's KV events, beside the
published and the measured one, and a residency timeline beside the report. Against
`ctxlab serve --kv-events-endpoint` (vLLM's format; tests/probe/test_probe_vllm.py checks
vLLM itself), and the endpoint mistakes: off loopback, and one where nobody publishes."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import run_in_process
from tests.servers import CTXLAB_PAGE, CTXLAB_POOL, SHARED, Served, free_port

pytest.importorskip("zmq")
pytest.importorskip("msgpack")


def _figures(doc: dict, section: str) -> dict[str, dict]:
    return {f["name"]: f for f in doc["sections"][section]}


def test_an_endpoint_off_loopback_is_one_sentence(monkeypatch, capsys, tmp_path):
    r = run_in_process(
        monkeypatch, capsys, "probe", "--server", "http://127.0.0.1:9", "--yes",
        "--kv-events", "tcp://10.1.2.3:5557", "--out", str(tmp_path / "p.json"),
    )  # fmt: skip
    assert r.code == 2 and len(r.err_lines) == 1, r.err
    assert "--kv-events 'tcp://10.1.2.3:5557' is not on this machine's loopback" in r.err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.server
@pytest.mark.model
@pytest.mark.xdist_group(SHARED)
def test_a_silent_endpoint_never_holds_the_probe(ctxlab_server, monkeypatch, capsys, tmp_path):
    out = tmp_path / "p.json"
    silent = f"tcp://127.0.0.1:{free_port()}"  # nobody publishes there
    r = run_in_process(
        monkeypatch, capsys, "probe", "--server", ctxlab_server, "--yes", "--out", str(out),
        "--sections", "prefix", "--longest", "70", "--kv-events", silent,
    )  # fmt: skip
    assert r.code == 0, r.err
    doc = json.loads(out.read_text())
    got = _figures(doc, "KV events")["capacity from KV events"]
    assert got["value"] is None and got["how"] == "not measurable"
    assert got["note"].startswith(f"no KV events arrived from {silent}")
    assert doc["details"]["kv events"]["batches"] == 0
    assert (tmp_path / "p-residency.png").is_file()


@pytest.mark.server
@pytest.mark.model
@pytest.mark.xdist_group(SHARED)
def test_events_confirm_ctxlab_serves_pool(ctxlab_served: Served, monkeypatch, capsys, tmp_path):
    """The shared server publishes its KV events; the probe fills its cache (what it
    evicts, no later test reads back)."""
    out = tmp_path / "probe.json"
    r = run_in_process(
        monkeypatch, capsys, "probe", "--server", ctxlab_served.url, "--yes", "--out", str(out),
        "--sections", "prefix,capacity", "--longest", str(3 * CTXLAB_PAGE),
        "--kv-events", ctxlab_served.kv_events,
    )  # fmt: skip
    assert r.code == 0, r.err
    doc = json.loads(out.read_text())
    cap = _figures(doc, "capacity")
    events = cap["capacity from KV events"]
    assert events["how"] == "measured", events
    assert abs(events["value"] - CTXLAB_POOL) <= CTXLAB_PAGE
    assert cap["prefix-cache capacity"]["how"] == "measured"
    assert "capacity from KV events" in r.out
    res = json.loads((tmp_path / "probe-residency.json").read_text())
    assert res["summary"]["block_size"] == CTXLAB_PAGE
    assert res["summary"]["evictions"] > 0 and res["timeline"]
    assert res["batches"] > 0 and doc["residency_file"].endswith("probe-residency.json")
    assert (tmp_path / "probe-residency.png").is_file()
