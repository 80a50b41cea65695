"""Rate cards: length tiers over the whole prompt, the shipped dated card, and bad files as
one sentence with exit code 2 (issue 37, "the bill, complete")."""

from __future__ import annotations

import json
import re

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.plan.cost import HostedPrices
from ctxlab.plan.rate_card import DEFAULT_PATH, RateCard, load_rate_card, parse_rate_card
from ctxlab.plan.report import build_plan
from tests.cli.conftest import run_in_process

GOOD = """\
name = "two tiers"
date = 2025-11-18
currency = "EUR"
region = "eu-west"
tier = "standard"
unit_tokens = 1000000
source = "a test"

[[prices]]
above_tokens = 0
input = 1.0
output = 10.0
cache_write = 1.25
cache_read = 0.1

[[prices]]
above_tokens = 1000
input = 2.0
output = 20.0
cache_write = 2.5
cache_read = 0.2
"""


def test_the_seeds_figure_long_prompt_against_retrieval():
    """The seed prices a long prompt at $4.00 against $0.02 for retrieval. On the shipped card
    (Gemini 3 Pro Preview, 2025-11-18: 2.00 USD per million input tokens up to 200K, 4.00
    past it) that is a whole 1,000,000-token corpus in the prompt against the 10,000 tokens
    of retrieved passages, input only."""
    card = load_rate_card("default")
    assert (card.date, card.currency) == ("2025-11-18", "USD")
    long_prompt = card.cost(1_000_000, 0).total
    retrieval = card.cost(10_000, 0).total
    assert round(long_prompt, 2) == 4.00
    assert round(retrieval, 2) == 0.02
    assert long_prompt / retrieval == pytest.approx(200)  # 100x the tokens, 2x the rate


def test_the_whole_prompt_moves_to_the_higher_tier():
    card = parse_rate_card(GOOD, "good.toml")
    assert card.cost(1000, 0).total == pytest.approx(1000 * 1.0 / 1e6)
    # one token past the threshold and every token bills at the higher rate
    assert card.cost(1001, 0).total == pytest.approx(1001 * 2.0 / 1e6)
    # the tier is chosen by the whole prompt: cached tokens count toward the threshold
    c = card.cost(10, 100, cache_write_tokens=500, cache_read_tokens=600)
    assert c.uncached_input == pytest.approx(10 * 2.0 / 1e6)
    assert c.cache_write == pytest.approx(500 * 2.5 / 1e6)
    assert c.cache_read == pytest.approx(600 * 0.2 / 1e6)
    assert c.output == pytest.approx(100 * 20.0 / 1e6)
    assert card.tier_label(1000) == "base" and card.tier_label(1001) == "> 1,000 tokens"


def test_shipped_card_says_where_and_when():
    card = load_rate_card(DEFAULT_PATH)
    d = card.to_dict()
    assert d["region"] and d["tier"] and d["source"].startswith("https://")
    assert [t["above_tokens"] for t in d["prices"]] == [0, 200_000]
    assert card.self_hosted.network_per_gb is not None
    assert json.loads(json.dumps(d)) == d


def test_flat_prices_are_a_one_tier_card():
    card = RateCard.flat(HostedPrices(3, 15, 3.75, 0.3))
    assert card.cost(10**7, 0).total == pytest.approx(30)


def _card(**changes: str) -> str:
    text = GOOD
    for old, new in changes.items():
        assert old in text
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (_card(**{'currency = "EUR"\n': ""}), "missing currency"),
        (_card(**{"cache_read = 0.1\n": ""}), "missing prices[0].cache_read"),
        (_card(**{"input = 1.0": "input = -1.0"}), "prices[0].input must be a positive price"),
        (_card(**{"output = 20.0": 'output = "20"'}), "prices[1].output must be a positive"),
        (_card(**{"above_tokens = 1000": "above_tokens = 0"}), "tiers out of order"),
        (_card(**{"above_tokens = 0": "above_tokens = 10"}), "first [[prices]] tier must start"),
        (_card(**{"date = 2025-11-18": 'date = "last week"'}), "date must be the day"),
        (_card(**{"tier = ": "tire = "}), "missing tier"),
        (_card(**{'source = "a test"': 'source = "a test"\nextra = 1'}), "unknown key extra"),
        (_card(**{"unit_tokens = 1000000": "unit_tokens = 0"}), "unit_tokens must be"),
        (GOOD + "\n[self_hosted]\nnetwork_per_gb = -1\n", "self_hosted.network_per_gb must"),
        (GOOD + "\n[self_hosted]\ndisk = 1\n", "unknown key self_hosted.disk"),
        ("name = ", "not valid TOML"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not a text file"),
    ],
)
def test_bad_cards_are_one_sentence(text, fragment):
    with pytest.raises(CtxlabError, match="rate card") as info:
        parse_rate_card(text, "bad.toml")
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_plan_reads_a_card_and_prices_each_tier():
    card = parse_rate_card(GOOD, "good.toml")
    plan = build_plan("llama-3.1-8b", [1000, 2000], prices=card, output_tokens=0)
    rows = plan["sections"]["cost"]["rows"]
    assert [r["hosted_tier"] for r in rows] == ["base", "> 1,000 tokens"]
    assert rows[0]["hosted_cold_cost"] == pytest.approx(1000 / 1e6)
    assert rows[1]["hosted_cold_cost"] == pytest.approx(4000 / 1e6)
    assert plan["inputs"]["currency"] == "EUR"  # the card's currency
    assert plan["inputs"]["rate_card"]["date"] == "2025-11-18"


def test_cli_rate_card_file_and_default(monkeypatch, capsys, tmp_path):
    path = tmp_path / "card.toml"
    path.write_text(GOOD)
    r = run_in_process(
        monkeypatch, capsys, "plan", "llama-3.1-8b", "-c", "1000,2000", "--rate-card", str(path),
        "--output-tokens", "0", "--json",
    )  # fmt: skip
    assert r.code == 0, r.err
    rows = json.loads(r.out)["sections"]["cost"]["rows"]
    assert rows[1]["hosted_cold_cost"] == pytest.approx(0.004)
    r = run_in_process(
        monkeypatch, capsys, "plan", "llama-3.1-8b", "-c", "10000,1000000", "--rate-card",
        "default", "--output-tokens", "0",
    )  # fmt: skip
    assert r.code == 0, r.err
    assert "4 USD" in r.out and "0.02 USD" in r.out and "2025-11-18" in r.out


@pytest.mark.parametrize(
    ("setup", "args", "fragment"),
    [
        (b"\x00\x01\x02binary", (), "not a text file"),
        (GOOD.replace("input = 1.0", "input = -3"), (), "must be a positive price"),
        (GOOD.replace('region = "eu-west"\n', ""), (), "missing region"),
        (GOOD, ("--price-input", "3", "--price-output", "15"), "one way"),
        (GOOD, ("--currency", "USD"), "relabel"),
        (None, (), "does not exist"),
    ],
    ids=["binary", "negative", "missing", "two-ways", "currency", "absent"],
)
def test_cli_bad_rate_card_exits_2(monkeypatch, capsys, tmp_path, setup, args, fragment):
    path = tmp_path / "card.toml"
    if setup is not None:
        path.write_bytes(setup if isinstance(setup, bytes) else setup.encode())
    r = run_in_process(monkeypatch, capsys, "plan", "llama-3.1-8b", "--rate-card", str(path), *args)
    assert r.code == 2
    assert fragment in r.err
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1


def test_workshop_config_reads_a_card(tmp_path):
    """`[cost] rate_card` replaces the flat rates; a bad card is the config's one sentence."""
    from ctxlab.workshop.config_file import load_config

    default = load_config()
    assert default.cost.card().date == "not given"  # the flat rates, as before
    assert default.cost.self_hosted_prices().network_per_gb == 0.0
    path = tmp_path / "w.toml"
    path.write_text('[cost]\nrate_card = "default"\n')
    cfg = load_config(path)
    assert cfg.cost.card().cost(1_000_000, 0).total == pytest.approx(4.0)
    assert cfg.cost.self_hosted_prices().network_per_gb == 0.02  # the card's rate wins
    (tmp_path / "bad.toml").write_text(GOOD.replace("input = 1.0", "input = -1.0"))
    path.write_text(f'[cost]\nrate_card = "{tmp_path / "bad.toml"}"\ncurrency = "EUR"\n')
    with pytest.raises(CtxlabError, match=re.escape("prices[0].input must be a positive price")):
        load_config(path)
    path.write_text('[cost]\nrate_card = "default"\ncurrency = "EUR"\n')
    with pytest.raises(CtxlabError, match="differs from the rate card's 'USD'"):
        load_config(path)


def test_card_self_hosted_rates_apply_only_with_a_device_rate(monkeypatch, capsys, tmp_path):
    path = tmp_path / "card.toml"
    path.write_text(GOOD + "\n[self_hosted]\ncpu_hourly = 0.5\nnetwork_per_gb = 0\n")
    base = ("plan", "llama-3.1-8b", "-c", "2000", "--rate-card", str(path), "--json")
    r = run_in_process(monkeypatch, capsys, *base)
    assert r.code == 0, r.err  # hosted only: no device rate, so no self-hosted bill
    assert json.loads(r.out)["per_context"][0]["self_hosted_total_cost"] is None
    r = run_in_process(
        monkeypatch, capsys, *base, "--gpu-hourly", "1", "--gpu-seconds", "3600",
        "--cpu-seconds", "3600", "--network-bytes", "1TB",
    )  # fmt: skip
    assert r.code == 0, r.err
    terms = json.loads(r.out)["per_context"][0]["self_hosted_cost_terms"]
    assert terms["cpu"] == pytest.approx(0.5) and terms["network"] == 0  # priced, and free
