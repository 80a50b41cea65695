"""Each demonstration's measurement on the default model at tiny sizes, read from one real
run (`tiny_run` in conftest.py), and the verdicts that run produced."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model


def demo(tiny_run, key: str) -> dict:
    results, _ = tiny_run
    d = results["demos"][key]
    assert d["status"] == "run", d["status"]
    return d


def obs(d: dict, metric: str) -> tuple:
    o = d["observations"][metric]
    return o["baseline"], o["observed"]


def test_prefix_miss_counts_reused_tokens(tiny_run) -> None:
    d = demo(tiny_run, "prefix_miss")
    # exact resend: every block but the one holding the last token; 64 tokens, page 16
    assert obs(d, "reused_tokens_at_token0") == (48, 0)
    assert obs(d, "reused_tokens_mid") == (48, 32)
    assert obs(d, "reused_tokens_last_block") == (48, 48)
    assert obs(d, "recomputed_tokens_at_token0") == (16, 64)
    assert obs(d, "reused_tokens_other_tenant") == (48, 0)
    base, seen = obs(d, "ttft_ms_at_token0")
    assert base > 0 and seen > 0
    storage = next(t for t in d["tables"] if t["layer"] == "storage")
    rows = {r[0]: r for r in storage["rows"]}
    assert rows["middle"][4] == "yes" and rows["token 0"][4] == "no"  # hit request or not
    serving = next(t for t in d["tables"] if t["key"] == "prefix_miss_serving")
    col = columns(serving)
    for r in serving["rows"]:
        med = r[col["TTFT median ms"]]
        assert r[col["TTFT median 95 % low"]] <= med <= r[col["TTFT median 95 % high"]]


def test_warm_prefix_reuses_the_prefix(tiny_run) -> None:
    d = demo(tiny_run, "warm_prefix")
    assert obs(d, "reused_tokens") == (0, 64)
    assert obs(d, "recomputed_tokens") == (80, 16)
    cold, warm = obs(d, "tpot_ms")
    assert cold > 0 and warm > 0
    assert d["observations"]["ttft_ms"]["noise"] is not None  # the spread is stated
    ttft = d["observations"]["ttft_ms"]  # and the interval of the change, from the repeats
    assert ttft["change_low"] <= ttft["observed"] - ttft["baseline"] <= ttft["change_high"]
    serving = next(t for t in d["tables"] if t["key"] == "warm_prefix_serving")
    col = {c["name"]: i for i, c in enumerate(serving["columns"])}
    for row in serving["rows"]:
        med = row[col["TTFT median ms"]]
        assert row[col["TTFT median 95 % low"]] <= med <= row[col["TTFT median 95 % high"]]
        assert row[col["ITL gaps"]] > 0


def columns(table: dict) -> dict[str, int]:
    return {c["name"]: i for i, c in enumerate(table["columns"])}


def test_page_size_waste_and_reuse_match_the_planner(tiny_run) -> None:
    d = demo(tiny_run, "page_size")
    waste = next(t for t in d["tables"] if t["key"] == "page_size_waste")
    col = columns(waste)
    by_page = {r[0]: r for r in waste["rows"]}
    names = ("allocated slots (pool)", "waste tokens (pool)", "waste tokens (planner)")
    # requests of 40 and 100 tokens: page 16 holds 48 + 112, page 64 holds 64 + 128
    assert [by_page[1][col[n]] for n in names] == [140, 0, 0]
    assert [by_page[16][col[n]] for n in names] == [160, 20, 20]
    assert [by_page[64][col[n]] for n in names] == [192, 52, 52]
    assert all(r[col["requests"]] == 2 for r in waste["rows"])  # the n of every count
    assert len({r[col["bytes per token slot (pool)"]] for r in waste["rows"]}) == 1
    reuse = next(t for t in d["tables"] if t["key"] == "page_size_reuse")
    rc = columns(reuse)
    engine = [r[rc["reused tokens (engine)"]] for r in reuse["rows"]]
    assert engine == [70, 64, 64] == [r[rc["reused tokens (planner)"]] for r in reuse["rows"]]
    assert all(r[rc["pairs sent"]] == 3 for r in reuse["rows"])


def test_page_size_ttft_is_a_median_of_repeats_with_its_interval_and_verdict(tiny_run) -> None:
    d = demo(tiny_run, "page_size")
    serving = next(t for t in d["tables"] if t["key"] == "page_size_serving")
    col = columns(serving)
    rows = serving["rows"]
    for r in rows:
        assert r[col["pairs"]] == 3
        med = r[col["diverging prompt TTFT median ms"]]
        assert r[col["95 % low"]] <= med <= r[col["95 % high"]]
    assert rows[0][col["verdict"]] == "baseline"
    for r in rows[1:]:
        change = r[col["change vs page 1 ms"]]
        assert r[col["change 95 % low"]] <= change <= r[col["change 95 % high"]]
        assert r[col["verdict"]] in ("held", "failed", "within noise")
        assert r[col["predicted"]] == "up"
    ttft = d["observations"]["ttft_ms_after_divergence"]
    assert ttft["samples"] == 3 and "bootstrap" in ttft["test"]
    assert ttft["change_low"] <= ttft["observed"] - ttft["baseline"] <= ttft["change_high"]


def test_eviction_engine_beside_simulator(tiny_run) -> None:
    d = demo(tiny_run, "eviction")
    grouped, interleaved = obs(d, "reused_tokens")
    assert grouped > interleaved
    assert obs(d, "evictions")[1] > 0
    rows = next(t for t in d["tables"] if t["key"] == "eviction_storage")["rows"]
    sides = {(r[0], r[1]) for r in rows}
    assert sides == {(o, s) for o in ("grouped", "interleaved") for s in ("engine", "simulator")}
    for r in rows:  # every request's prompt is queried once: reused + computed is the same
        assert r[2] + r[3] == rows[0][2] + rows[0][3]
    engine_i, sim_i = obs(d, "sim_vs_engine_ttft_p50_ms")
    assert engine_i > 0 and sim_i > 0


def test_recurrent_against_kv_heavy(tiny_run) -> None:
    d = demo(tiny_run, "recurrent_vs_kv")
    kv, rec = obs(d, "bytes_per_request")
    assert rec < kv
    long, short = obs(d, "engine_concurrency_reached")
    assert short == 4 and long == 2  # 512 tokens of pool: two 208-token requests at once
    long_b, short_b = obs(d, "engine_bytes_per_request")
    assert long_b > short_b
    assert d["mode"] == "measured and modeled"
    modes = {t["key"]: t["mode"] for t in d["tables"]}
    assert modes == {
        "recurrent_storage": "modeled",
        "recurrent_serving": "modeled",
        "recurrent_engine": "measured",
        "recurrent_compare": "measured and modeled",
        "recurrent_windowed": "measured",
    }
    # the windowed model against the all-global one, pools of equal bytes (both measured)
    rows = next(t for t in d["tables"] if t["key"] == "recurrent_windowed")["rows"]
    assert [r[0] for r in rows] == ["smollm2-135m", "gemma3-270m"]
    assert rows[1][1].startswith("15 sliding (W = 512)")
    assert all(r[4] >= 1 and r[5] > 0 for r in rows)
    assert rows[1][5] < rows[0][5]  # Gemma's request holds fewer bytes


VERDICT_WORDS = ("held", "failed", "within noise")


def test_eviction_ttft_percentiles_have_their_n_intervals_and_verdicts(tiny_run) -> None:
    d = demo(tiny_run, "eviction")
    serving = next(t for t in d["tables"] if t["key"] == "eviction_serving")
    col = columns(serving)
    for r in serving["rows"]:
        assert r[col["requests"]] == 6  # 3 groups x 2 requests
        assert r[col["p50 95 % low"]] <= r[col["TTFT p50 ms"]] <= r[col["p50 95 % high"]]
        assert r[col["p99 95 % low"]] <= r[col["TTFT p99 ms"]] <= r[col["p99 95 % high"]]
    compare = next(t for t in d["tables"] if t["key"] == "eviction_compare")
    cc = columns(compare)
    assert len(compare["rows"]) == 3
    for r in compare["rows"]:
        assert r[cc["change 95 % low"]] <= r[cc["change ms"]] <= r[cc["change 95 % high"]]
        assert r[cc["verdict"]] in VERDICT_WORDS
        assert "bootstrap" in r[cc["test"]]
    assert "paired" in compare["rows"][2][cc["test"]]  # simulator and engine: same requests
    o = d["observations"]["ttft_p99_ms"]
    assert o["samples"] == 6 and o["change_low"] <= o["change_high"]


def test_recurrent_engine_ttft_has_intervals_and_compared_figures_verdicts(tiny_run) -> None:
    d = demo(tiny_run, "recurrent_vs_kv")
    for key in ("recurrent_engine", "recurrent_windowed"):
        table = next(t for t in d["tables"] if t["key"] == key)
        col = columns(table)
        for r in table["rows"]:
            assert r[col["p50 95 % low"]] <= r[col["TTFT p50 ms"]] <= r[col["p50 95 % high"]]
            assert r[col["p99 95 % low"]] <= r[col["TTFT p99 ms"]] <= r[col["p99 95 % high"]]
    compare = next(t for t in d["tables"] if t["key"] == "recurrent_compare")
    cc = columns(compare)
    rows = {r[cc["metric"]]: r for r in compare["rows"]}
    for metric in ("bytes_per_request", "concurrency_reached", "ttft_p99_ms"):
        r = rows[metric]  # modeled: exact, so held or failed, never within noise
        assert r[cc["verdict"]] in ("held", "failed")
        assert r[cc["change 95 % low"]] == r[cc["change"]] == r[cc["change 95 % high"]]
    assert rows["bytes_per_request"][cc["verdict"]] == "held"  # fixed state is smaller
    engine = rows["engine_ttft_p99_ms"]
    assert engine[cc["n (baseline, observed)"]] == "2, 4"
    assert engine[cc["verdict"]] in VERDICT_WORDS and "bootstrap" in engine[cc["test"]]


def test_disaggregation_counts_both_processes(tiny_run) -> None:
    """Demonstration 9 ran a real prefill process: a second copy of the weights resident,
    the KV of the long prompt moved page by page (whole pages of the prompt minus its last
    token), and the simulator's prediction beside the measurement."""
    d = demo(tiny_run, "disaggregation")
    f = d["figures"]
    assert obs(d, "kv_bytes_per_request") == (0, 7 * 16 * 46080)
    assert f["kv_pages"] == 7
    assert f["child_rss_mib"] > f["weights_mib"] > 500
    assert f["kv_ms"] > 0 and f["bandwidth_gbs"] > 0
    assert obs(d, "sim_vs_measured_ttft_p50_ms")[1] > 0
    rows = next(t for t in d["tables"] if t["key"] == "disagg_serving")["rows"]
    assert [r[0] for r in rows] == ["colocated", "disaggregated", "disaggregated (simulated)"]
    results, _ = tiny_run
    row = next(c for c in results["checklist"] if "disaggregat" in c["risk"])
    assert row["status"] == "guarded" and "second copy of the weights" in row["how"]


def test_verdicts_report_the_wrong_prediction_failed(tiny_run) -> None:
    results, out = tiny_run
    by_metric = {(v["key"], v["metric"]): v for v in results["verdicts"]}
    wrong = by_metric[("prefix_miss", "reused_tokens_at_token0")]
    assert wrong["verdict"] == "failed"
    assert by_metric[("prefix_miss", "reused_tokens_mid")]["verdict"] == "held"
    assert by_metric[("page_size", "waste_tokens_vs_planner")]["verdict"] == "held"
    assert results["verdict_counts"]["failed"] >= 1
    report = (out / "report.md").read_text()
    assert "Failed predictions:" in report
    assert "1. reused_tokens_at_token0: predicted up" in report


def test_required_metrics_make_the_status(tiny_run) -> None:
    results, _ = tiny_run
    assert all(r["measured"] for r in results["required_metrics"])
    assert results["status"] == "complete"


def test_useful_context_comes_from_the_eval(tiny_run) -> None:
    results, _ = tiny_run
    u = results["useful_context"]
    assert [r["length"] for r in u["rows"]] == [256]
    numbers = {r["name"]: r["tokens"] for r in results["context_numbers"]}
    assert numbers["measured useful context"] == u["effective_length"]
    assert numbers["configured maximum length"] == 1024
    assert numbers["prompt budget after reserved output"] == 960
    assert numbers["advertised window"] == 8192
    assert numbers["resident cache tokens"] > 0


def test_an_arch_that_is_not_the_engine_model_is_refused(loaded, tiny_config, tmp_path) -> None:
    from ctxlab.errors import CtxlabError
    from ctxlab.workshop.config_file import load_config
    from ctxlab.workshop.session import Session

    mine = tmp_path / "other.toml"
    mine.write_text(
        tiny_config.read_text().replace("[model]\n", "[model]\narch = 'llama-3.1-8b'\n")
    )
    session = Session(load_config(mine), loaded, tmp_path)
    with pytest.raises(CtxlabError, match=r"does not describe model\.source"):
        session.check_arch()
    Session(load_config(tiny_config), loaded, tmp_path).check_arch()  # the file's own view


def test_offload_restores_what_eviction_dropped_and_failures_change_no_token(tiny_run) -> None:
    d = demo(tiny_run, "offload")
    base, tier = obs(d, "restored_tokens")
    assert base == 0 and tier > 0 and tier % 16 == 0  # whole pages of the prefixes
    no_tier, with_tier = obs(d, "reused_tokens")
    assert with_tier >= no_tier + tier  # every restored token is a reused one
    assert obs(d, "recomputed_tokens")[1] < obs(d, "recomputed_tokens")[0]
    assert obs(d, "wrong_tokens_under_failure") == (0, 0)
    assert obs(d, "bytes_moved")[1] > 0
    f = d["figures"]
    assert f["injected_failures"] >= 1 and f["failed_restores"] == f["injected_failures"]
    storage = next(t for t in d["tables"] if t["key"] == "offload_storage")
    rows = {r[0]: r for r in storage["rows"]}
    assert set(rows) >= {"engine, no tier", "engine, tier", "simulator, tier"}
    assert rows["engine, tier"][2] == tier
    assert {t["layer"] for t in d["tables"]} == {"storage", "serving", "cost"}
    results, _ = tiny_run
    row = next(c for c in results["checklist"] if c["risk"] == "offload without queueing")
    assert row["status"] == "guarded" and "0 wrong output tokens" in row["how"]
