"""The lab's endpoint over real HTTP: the CLI's figures, and a 400 naming each bad field."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from typer.testing import CliRunner

from ctxlab.cli import app


def post(url: str, body: Any, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(
        url + "api/plan", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def cli_plan(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


# (preset, context, concurrency, page size, shared prefix, device GiB, weights GiB or None)
CASES = [
    ("llama-3.1-8b", 131_072, 8, 16, 0, 80, 48),
    ("llama-3.1-8b", 1_001, 4, 16, 500, 80, None),
    ("gemma-3-27b", 131_072, 2, 256, 4_096, 141, None),
    ("mistral-7b-v0.1", 100_000, 3, 64, 2_000, 80, None),
    ("deepseek-v3", 32_768, 16, 64, 1_000, 2_048, None),
    ("jamba-v0.1", 262_144, 5, 32, 8_192, 192, None),
    ("kimi-linear-48b-a3b", 65_537, 7, 128, 100, 192, None),
]


@pytest.mark.parametrize("preset,context,n,page,prefix,mem_gib,weights_gib", CASES)
def test_endpoint_gives_the_cli_figures(
    lab_url: str,
    preset: str,
    context: int,
    n: int,
    page: int,
    prefix: int,
    mem_gib: int,
    weights_gib: int | None,
) -> None:
    form = {
        "arch": "preset",
        "preset": preset,
        "context": str(context),
        "concurrency": str(n),
        "page_size": str(page),
        "shared_prefix": str(prefix),
        "device_memory_gib": str(mem_gib),
        "weights_gib": "" if weights_gib is None else str(weights_gib),
        "reserve_gib": "8",
    }
    status, body = post(lab_url, form)
    assert status == 200, body
    args = [preset, "--context", str(context), "--concurrency", str(n), "--page-size",
            str(page), "--shared-prefix", str(prefix), "--memory-bytes", f"{mem_gib}GiB",
            "--reserve-bytes", "8GiB"]  # fmt: skip
    if weights_gib is not None:
        args += ["--weights-bytes", f"{weights_gib}GiB"]
    plan = cli_plan(args)
    row = plan["per_context"][plan["contexts"].index(context)]
    figures = body["figures"]
    if plan["kv_bytes_per_token"] == 0:
        assert figures["logical"]["bytes"] == row["kv_bytes_for_concurrency"]
    else:
        assert figures["logical"]["bytes"] == plan["kv_bytes_per_token"]
    assert figures["physical"]["bytes"] == row["allocated_bytes_for_concurrency"]
    assert figures["prefix_avoided"]["bytes"] == row["bytes_avoided_by_sharing"]
    assert figures["page_waste"]["bytes"] == row["wasted_bytes_per_request"]
    assert body["capacity"]["sentence"] == row["capacity_sentence"]
    assert (
        body["capacity"]["kv_budget_bytes"]
        == plan["sections"]["capacity"]["summary"]["kv_budget_bytes"]
    )
    assert [f["layer"] for f in figures.values()] == [
        "representation",
        "allocation",
        "sharing",
        "allocation",
    ]
    chart = {p["context"]: p for p in body["chart"]["points"]}
    assert chart[context]["physical_bytes"] == row["allocated_bytes_for_concurrency"]


def test_published_capacity_example(lab_url: str) -> None:
    """80 GiB device, 48 GiB weights, 8 GiB reserve: one 128K llama-3.1-8b request fits."""
    status, body = post(
        lab_url,
        {"preset": "llama-3.1-8b", "context": "131072", "concurrency": "1",
         "device_memory_gib": "80", "weights_gib": "48", "reserve_gib": "8"},
    )  # fmt: skip
    assert status == 200, body
    assert body["figures"]["logical"]["bytes"] == 131_072
    assert body["figures"]["physical"]["bytes"] == 16 * 1024**3
    assert "one fits, two do not" in body["capacity"]["sentence"]


def test_page_size_moves_allocation_only(lab_url: str) -> None:
    base = {"preset": "llama-3.1-8b", "context": "1001", "concurrency": "1"}
    _, small = post(lab_url, {**base, "page_size": "16"})
    _, large = post(lab_url, {**base, "page_size": "256"})
    assert small["figures"]["logical"] == large["figures"]["logical"]
    # 1,001 tokens in 16-token pages leave 7 slots; in 256-token pages 23 slots.
    assert small["figures"]["page_waste"]["bytes"] == 7 * 131_072
    assert large["figures"]["page_waste"]["bytes"] == 23 * 131_072


def test_raw_fields_match_the_same_preset(lab_url: str) -> None:
    """Raw fields describing llama-3.1-8b's cache give the preset's per-token figure."""
    raw = {"arch": "raw", "full_layers": "32", "kv_heads": "8", "d_k": "128", "d_v": "128",
           "context": "4096", "weights_gib": "15"}  # fmt: skip
    status, body = post(lab_url, raw)
    assert status == 200, body
    _, preset = post(lab_url, {"preset": "llama-3.1-8b", "context": "4096", "weights_gib": "15"})
    for key in ("logical", "physical", "page_waste"):
        assert body["figures"][key]["bytes"] == preset["figures"][key]["bytes"]


def test_raw_fixed_state_model_reports_total_state(lab_url: str) -> None:
    form = {"arch": "raw", "full_layers": "0", "recurrent_layers": "4",
            "recurrent_kind": "kda", "rec_heads": "2", "rec_head_dim": "8",
            "concurrency": "3", "weights_gib": "1"}  # fmt: skip
    status, body = post(lab_url, form)
    assert status == 200, body
    # 4 layers x 2 heads x 8 x 8 elements x 2 bytes, for 3 requests.
    assert body["figures"]["logical"]["bytes"] == 3 * 4 * 2 * 8 * 8 * 2
    assert "fixed" in body["figures"]["logical"]["denominator"]


BAD_FIELDS = [
    ({"context": "-5"}, "context"),
    ({"context": "0"}, "context"),
    ({"context": "abc"}, "context"),
    ({"context": "10.5"}, "context"),
    ({"context": "1e30"}, "context"),
    ({"concurrency": "NaN"}, "concurrency"),
    ({"page_size": "0"}, "page_size"),
    ({"shared_prefix": "200000"}, "shared_prefix"),
    ({"device_memory_gib": "-80"}, "device_memory_gib"),
    ({"device_memory_gib": "10"}, "device_memory_gib"),  # llama-3.1-8b weights do not fit
    ({"weights_gib": "90"}, "weights_gib"),
    ({"reserve_gib": "70"}, "reserve_gib"),
    ({"preset": "gpt-5"}, "preset"),
    ({"bytes_per_element": "3"}, "bytes_per_element"),
    ({"arch": "magic"}, "arch"),
    ({"colour": "blue"}, "colour"),
    ({"arch": "raw", "kv_heads": "0"}, "kv_heads"),
    ({"arch": "raw", "full_layers": "0"}, "full_layers"),
    ({"arch": "raw", "sliding_layers": "2", "window": "-1"}, "window"),
    ({"arch": "raw", "mla_layers": "2", "mla_d_c": "x"}, "mla_d_c"),
    ({"arch": "raw", "d_k": "1000000"}, "d_k"),
]


@pytest.mark.parametrize("fields,named", BAD_FIELDS)
def test_bad_field_is_a_400_naming_it(lab_url: str, fields: dict[str, str], named: str) -> None:
    status, body = post(lab_url, {"preset": "llama-3.1-8b", "context": "100000", **fields})
    assert status == 400
    assert named in body["errors"], body
    assert body["errors"][named]  # one sentence for the page to show beside the field


def test_raw_only_fields_are_ignored_for_a_preset(lab_url: str) -> None:
    status, body = post(lab_url, {"preset": "llama-3.1-8b", "kv_heads": "0"})
    assert status == 200, body


def test_broken_requests_do_not_crash_the_server(lab_url: str) -> None:
    assert post(lab_url, None, raw=b"{not json")[0] == 400
    assert post(lab_url, None, raw=b"[1, 2]")[0] == 400
    assert post(lab_url, {"context": ["a", "list"]})[0] == 400
    assert post(lab_url, {"context": True})[0] == 400
    assert get_status(lab_url + "api/plan?preset=qwen3-8b&context=8K") == 400
    assert get_status(lab_url + "api/plan?preset=qwen3-8b&context=8192") == 200
    status, _ = post(lab_url, {"preset": "qwen3-8b"})
    assert status == 200  # still serving


def test_page_and_assets_are_served_locally(lab_url: str) -> None:
    with urllib.request.urlopen(lab_url, timeout=30) as resp:
        html = resp.read().decode()
    assert 'src="/static/lab.js"' in html
    assert "://" not in html  # no CDN, nothing fetched from elsewhere
    for name, kind in (("lab.js", "javascript"), ("lab.css", "css")):
        with urllib.request.urlopen(lab_url + "static/" + name, timeout=30) as resp:
            assert kind in resp.headers["Content-Type"]
    with urllib.request.urlopen(lab_url + "api/meta", timeout=30) as resp:
        meta = json.loads(resp.read())
    assert "llama-3.1-8b" in [p["name"] for p in meta["presets"]]
    assert {f["name"]: f["layer"] for f in meta["fields"]}["page_size"] == "allocation"
    assert get_status(lab_url + "static/../form.py") == 404
    assert get_status(lab_url + "static/%2e%2e/form.py") == 404
