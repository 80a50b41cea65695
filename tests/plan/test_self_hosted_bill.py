"""The self-hosted bill: every term of the storage formula, and failures raising the cost per
success while the cost per token stays put (issue 37, "the bill, complete")."""

from __future__ import annotations

import json

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.plan.cost import SelfHostedRates
from ctxlab.plan.report import build_plan
from ctxlab.plan.self_hosted import (
    GB,
    MONTH_SECONDS,
    SelfHostedPrices,
    Usage,
    self_hosted_bill,
)
from tests.cli.conftest import run_in_process

PRICES = SelfHostedPrices(
    device_hourly=3.6, cpu_hourly=0.36, network_per_gb=0.02, storage_per_gb_month=0.08
)


def _run(requests: int, failed: int, cancelled: int = 0) -> Usage:
    """`requests` requests of one shape, each using the same machine work, some failing."""
    per_request = {"device": 2.0, "cpu": 1.0, "net": 50 * 10**6, "store": 4e9, "tokens": 4096}
    return Usage(
        device_seconds=per_request["device"] * requests,
        cpu_seconds=per_request["cpu"] * requests,
        network_bytes=per_request["net"] * requests,
        storage_byte_seconds=per_request["store"] * requests,
        idle_reserve=0.2,
        tokens=per_request["tokens"] * requests,
        succeeded=requests - failed - cancelled,
        failed=failed,
        cancelled=cancelled,
    )


def test_every_term_of_the_formula():
    usage = Usage(
        device_seconds=3600,
        cpu_seconds=7200,
        network_bytes=5 * GB,
        storage_byte_seconds=2 * GB * MONTH_SECONDS,
        idle_reserve=0.25,
        succeeded=10,
        tokens=10**6,
    )
    bill = self_hosted_bill(usage, PRICES)
    assert bill.device == pytest.approx(3.6)
    assert bill.cpu == pytest.approx(0.72)
    assert bill.network == pytest.approx(0.10)
    assert bill.storage == pytest.approx(0.16)
    # a quarter of provisioned time idle: 1 busy hour carries 1/3 hour of reserve
    assert bill.idle_reserve == pytest.approx(3.6 / 3)
    assert bill.total == pytest.approx(3.6 + 0.72 + 0.10 + 0.16 + 1.2)
    assert bill.per_success == pytest.approx(bill.total / 10)
    assert bill.per_token == pytest.approx(bill.total / 10**6)
    assert set(bill.terms()) == {"device", "cpu", "network", "storage", "idle_reserve"}


def test_failures_raise_cost_per_success_not_cost_per_token():
    clean = self_hosted_bill(_run(100, failed=0), PRICES)
    failing = self_hosted_bill(_run(100, failed=10), PRICES)
    worse = self_hosted_bill(_run(100, failed=10, cancelled=15), PRICES)
    assert failing.per_token == pytest.approx(clean.per_token)
    assert worse.per_token == pytest.approx(clean.per_token)
    assert failing.per_request == pytest.approx(clean.per_request)
    assert clean.per_success < failing.per_success < worse.per_success
    assert failing.per_success == pytest.approx(clean.per_success * 100 / 90)
    assert worse.per_success == pytest.approx(clean.per_success * 100 / 75)


def test_a_term_without_its_rate_is_one_sentence():
    with pytest.raises(CtxlabError, match="network bytes were given without a price"):
        self_hosted_bill(Usage(1, 1, network_bytes=10), SelfHostedPrices(device_hourly=1))
    # a zero term needs no rate
    assert self_hosted_bill(Usage(1, 1), SelfHostedPrices(device_hourly=1)).network == 0
    with pytest.raises(CtxlabError, match="0 <= r < 1"):
        Usage(1, 1, idle_reserve=1)
    with pytest.raises(CtxlabError, match="successful requests must be positive"):
        Usage(1, 0, failed=3)
    with pytest.raises(CtxlabError, match="must be zero or positive"):
        SelfHostedPrices(network_per_gb=-0.01)
    # zero is a price (free transfers inside one machine), None is no price
    free = SelfHostedPrices(device_hourly=1, network_per_gb=0)
    assert self_hosted_bill(Usage(1, 1, network_bytes=10**12), free).network == 0


def test_plan_rows_carry_the_bill():
    def row(failed: int) -> dict:
        rates = SelfHostedRates(
            gpu_hourly=2.0,
            successes=9,
            failed=failed,
            network_bytes=10**9,
            storage_byte_seconds=1e12,
            idle_reserve=0.1,
            network_per_gb=0.02,
            storage_per_gb_month=0.08,
        )
        plan = build_plan("llama-3.1-8b", [8192], self_hosted=rates, output_tokens=64)
        return plan["per_context"][0]

    ok, bad = row(0), row(3)
    assert ok["self_hosted_requests"] == {"succeeded": 9, "failed": 0, "cancelled": 0}
    assert ok["self_hosted_cost_terms"]["network"] == pytest.approx(0.02)
    assert ok["self_hosted_cost_terms"]["idle_reserve"] > 0
    assert bad["self_hosted_cost_per_success"] > ok["self_hosted_cost_per_success"]
    # the roofline mode prices every request at its time, so per token barely moves (the
    # run totals, network and storage, are spread over more tokens)
    assert bad["self_hosted_cost_per_token"] <= ok["self_hosted_cost_per_token"]


def test_cli_prices_every_term(monkeypatch, capsys, tmp_path):
    args = (
        "plan", "llama-3.1-8b", "-c", "8192", "--rate-card", "default", "--gpu-hourly", "2",
        "--gpu-seconds", "100", "--successes", "90", "--failed", "6", "--cancelled", "4",
        "--network-bytes", "20GB", "--storage-byte-seconds", "3e13", "--idle-reserve", "0.25",
        "--json",
    )  # fmt: skip
    r = run_in_process(monkeypatch, capsys, *args)
    assert r.code == 0, r.err
    row = json.loads(r.out)["per_context"][0]
    terms = row["self_hosted_cost_terms"]
    assert terms["device"] == pytest.approx(100 * 2 / 3600)
    assert terms["network"] == pytest.approx(20 * 0.02)  # the shipped card's network rate
    assert terms["storage"] == pytest.approx(3e13 / GB / MONTH_SECONDS * 0.08)
    assert terms["idle_reserve"] == pytest.approx(terms["device"] / 3)
    assert row["self_hosted_cost_per_success"] == pytest.approx(row["self_hosted_total_cost"] / 90)
    r = run_in_process(monkeypatch, capsys, "plan", "llama-3.1-8b", "--failed", "2")
    assert r.code == 2 and "--failed" in r.err and "--gpu-hourly" in r.err
    r = run_in_process(
        monkeypatch, capsys, "plan", "llama-3.1-8b", "--gpu-hourly", "2", "--network-bytes",
        "1GB",
    )  # fmt: skip
    assert r.code == 2 and "network_per_gb" in r.err
