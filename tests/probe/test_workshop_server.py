"""`ctxlab workshop --quick` through real servers: llama.cpp's server (a cache nobody here
wrote: one prompt per slot) and `ctxlab serve` (shared pages of 32 tokens), every
demonstration, the servers named in the report, side by side, and what a server cannot show
reported as not measurable with the reason.

The workshop runs once, in this process through the CLI's own entry point, against the
session's shared servers (tests/servers.py), with a `[[servers]]` list naming both: llama.cpp
first (the run's server: every demonstration a server takes part in, the predictions judged
on it) and `ctxlab serve` second (the probe summary and demonstration 3 side by side, then its
own pass through every demonstration that sends a server requests, under results["peers"]).
Every test reads that one run. The demonstrations that run on the local engine alone whatever
the server (`ServerMode` LOCAL: offload, disaggregation) are left out with `--only`: a server
changes nothing in them, and the tiny workshop run (tests/workshop) checks them."""

from __future__ import annotations

import copy
import io
import json
import logging
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from ctxlab.workshop.demonstration import LOCAL
from ctxlab.workshop.registry import REGISTERED
from tests.cli.conftest import Result, run_in_process
from tests.servers import CTXLAB_PAGE, CTXLAB_POOL, LLAMACPP_SLOTS, SHARED, Served
from tests.workshop.report_numbers import unmatched

# every demonstration a server takes part in (or that says why it cannot)
SERVER_DEMOS = [d.number for d in REGISTERED if d.server != LOCAL]
PAGE = CTXLAB_PAGE
POOL = CTXLAB_POOL

pytestmark = [pytest.mark.model, pytest.mark.server, pytest.mark.xdist_group(SHARED)]

# Below `--quick`'s own sizes where the tests read no figure that the size moves: every
# request here is prefilled by a one-thread server, twice (both servers), and this run is the
# suite's longest single fixture. What each test reads is unchanged: demonstration 1's
# reused tokens per case (2 repeats instead of 3), 4's capacity and order effect (4 groups
# of 2 requests instead of 3: the second of a group is still the hit), 5's metrics (they
# compare truncation with tiered memory; the model summary stays to send the summarizer's
# requests through the server, the "compact" strategy's are the same calls) and 6's chat
# (2 answered questions instead of 4) and 11's rows (3 questions instead of 6). A user's
# size table merged over `[quick]` is the config path this exercises as well.
SMALLER = """
[quick.prefix_miss]
repeats = 2

[quick.eviction]
requests_per_group = 2

[quick.compaction]
strategies = ["truncation", "summary", "tiered"]

[quick.retrieval_depth]
answer_questions = 2

[quick.long_vs_retrieval]
answer_questions = 3
"""


@dataclass
class Run:
    """One workshop run: what the command returned, and what it wrote under `out`."""

    res: Result
    out: Path

    @property
    def results(self) -> dict:
        return json.loads((self.out / "results.json").read_text())


class _Captured:
    """What `run_in_process` reads back, outside a test function (no `capsys` there)."""

    def __init__(self) -> None:
        self.out, self.err = io.StringIO(), io.StringIO()

    def readouterr(self) -> tuple[str, str]:
        return self.out.getvalue(), self.err.getvalue()


def workshop(out: Path, *args: str) -> Run:
    """`ctxlab workshop --quick ARGS --out OUT --json` in this process. The workshop sets
    torch's thread count from its config and quiets httpx's logger; both are put back."""
    import torch

    threads = torch.get_num_threads()
    httpx_log = logging.getLogger("httpx")
    level = httpx_log.level
    cap = _Captured()
    try:
        with pytest.MonkeyPatch.context() as mp, redirect_stdout(cap.out), redirect_stderr(cap.err):
            res = run_in_process(mp, cap, "workshop", "--quick", *args, "--out", str(out), "--json")
    finally:
        torch.set_num_threads(threads)
        httpx_log.setLevel(level)
    return Run(res, out)


@pytest.fixture(scope="module")
def through_both(llamacpp_server, ctxlab_served: Served, tmp_path_factory) -> Run:
    """Every demonstration through llama.cpp's server, then through `ctxlab serve`, whose
    KV events demonstration 4 reads its evictions from."""
    tmp = tmp_path_factory.mktemp("workshop-servers")
    config = tmp / "servers.toml"
    config.write_text(
        f'[[servers]]\nlabel = "llamacpp"\nurl = "{llamacpp_server}"\n\n'
        f'[[servers]]\nlabel = "paged"\nurl = "{ctxlab_served.url}"\n'
        f'api_key = "sk-not-needed"\nkv_events = "{ctxlab_served.kv_events}"\n\n' + SMALLER
    )
    return workshop(tmp / "out", str(config), "--only", ",".join(map(str, SERVER_DEMOS)))


def paged(run: Run) -> dict:
    """`ctxlab serve`'s own pass of the run (the second server of the list)."""
    return run.results["peers"]["paged"]


def completed(run: Run) -> dict:
    """A run that exited 0, complete, with every number its report prints stored."""
    assert run.res.code == 0, run.res.err[-3000:]
    results = run.results
    assert results["status"] == "complete" and not results["error"]
    assert unmatched(server_part(results), results) == []
    return results


def server_part(results: dict) -> str:
    """The report without the tables the local engine made (demonstration 7's own, on every
    server's pass, and the eval's: their numbers are the in-process workshop tests'
    business)."""
    from ctxlab.workshop.document import build_document
    from ctxlab.workshop.report_markdown import render_markdown

    doc = copy.deepcopy(results)
    peers = [d for p in doc.get("peers", {}).values() for d in p["demos"].values()]
    for d in [*doc["demos"].values(), *peers]:
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


def seven_on_the_server(results: dict, most: int) -> None:
    """7's workloads on the server, the concurrency from the server's own running-requests
    gauge: at least one request seen running, at most `most` (its slots, or all sent)."""
    d = results["demos"]["recurrent_vs_kv"]
    (table,) = [t for t in d["tables"] if t["key"] == "recurrent_vs_kv_server"]
    assert [r[0] for r in table["rows"]] == ["short", "long"]
    assert all(r[3] > 0 and r[4] >= r[3] for r in table["rows"])  # TTFT p50 <= p99
    assert all(isinstance(r[6], int) and 1 <= r[6] <= min(most, r[1]) for r in table["rows"])


# ------------------------------------------- through llama.cpp, ctxlab serve beside it


def test_both_run_completes_on_llamacpp_and_keeps_the_key_out(through_both):
    results = completed(through_both)
    assert results["server"]["engine"] == "llama.cpp"
    judged = [(v["demo"], v["metric"]) for v in results["verdicts"]]
    assert len(set(judged)) == len(judged)  # one verdict per prediction, also when not measurable
    assert "sk-not-needed" not in (through_both.out / "results.json").read_text()


def test_both_prefix_miss_on_llamacpp(through_both):
    # 1: a changed token 0 reuses nothing, an exact resend all but the last token, and
    # another cache_salt everything (llama.cpp does not isolate)
    results = through_both.results
    demos = results["demos"]
    rows = {r[0]: r for r in demos["prefix_miss"]["tables"][0]["rows"]}
    prompt = results["config"]["prefix_miss"]["prompt_tokens"]
    assert rows["cold"][2] == 0 and rows["token 0"][2] == 0
    assert rows["exact resend"][2] == rows["other tenant"][2] == prompt - 1
    assert all("llama.cpp" in t["title"] for t in demos["prefix_miss"]["tables"])


def test_both_page_size_side_by_side(through_both):
    # 3: not measurable as configured; each server's own page measured, side by side
    results = through_both.results
    three = results["demos"]["page_size"]
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


def test_both_eviction_sized_to_the_slots(through_both):
    # 4: sized to whole prompts per slot (2 slots keep 2 prompts), measured and predicted
    results = through_both.results
    four = results["demos"]["eviction"]
    assert four["status"] == "run" and four["figures"]["capacity_kept"] == 2
    assert four["figures"]["groups"] >= 4
    assert (through_both.out / "eviction-prediction.json").exists()
    v4 = verdicts(results, 4)
    assert v4["evictions"]["verdict"] == "not measurable"
    assert v4["reused_tokens"]["verdict"] in ("held", "failed")


def test_both_chat_and_seven_on_llamacpp(through_both):
    results = through_both.results
    through_chat(results, "llama.cpp")
    seven_on_the_server(results, LLAMACPP_SLOTS)


def test_both_report_names_the_servers(through_both):
    report = (through_both.out / "report.md").read_text()
    assert "server: llama.cpp" in report and "paged: ctxlab at" in report


# ------------------------------------------------------------- through ctxlab serve


def test_ctxlab_pass_completes_on_ctxlab(through_both):
    results = completed(through_both)
    peer = paged(through_both)
    assert peer["engine"] == "ctxlab" and peer["error"] == ""
    # every demonstration that sends a server requests ran through it, except 3 (its side
    # by side already covers both servers) and what cannot go through a server
    ran = {d["number"] for d in peer["demos"].values() if d["status"] == "run"}
    assert {1, 2, 4, 5, 6, 7} <= ran and 3 not in ran
    # every table names the server it came from; 7's local part is the first pass's
    assert all(peer["label"] in t["title"] for d in peer["demos"].values() for t in d["tables"])
    report = (through_both.out / "report.md").read_text()
    assert "The same demonstrations through the other servers" in report
    assert "each also measured through demonstrations" in report
    # one comparison table per demonstration measured through both APIs, a column each
    for n in sorted(ran - {7}):
        title = f"Demonstration {n} on every server"
        assert title in report
        header = report[report.index(title) :].splitlines()[2]
        assert header.endswith("| the run's server (llama.cpp) | paged |"), header
    assert "Demonstration 7 on every server" not in report  # its figures are the local engine's
    assert results["verdicts"] and all(v["key"] in results["demos"] for v in results["verdicts"])


def test_ctxlab_prefix_miss_reuses_whole_pages(through_both):
    demos = paged(through_both)["demos"]
    rows = {r[0]: r for r in demos["prefix_miss"]["tables"][0]["rows"]}
    prompt = through_both.results["config"]["prefix_miss"]["prompt_tokens"]
    whole = (prompt - 1) // PAGE * PAGE
    assert rows["exact resend"][2] == whole and rows["other tenant"][2] == 0


def measured(obs: dict) -> bool:
    """An observation with both values and the sample size its interval comes from."""
    return all(isinstance(obs[k], int | float) for k in ("baseline", "observed")) and bool(
        obs["samples"]
    )


def test_ctxlab_eviction_measured_to_the_page(through_both):
    # 4: the cache measured to the page, prefixes sized past it, the interleaved order
    # evicting: it reuses less than the grouped one
    four = paged(through_both)["demos"]["eviction"]
    assert four["status"] == "run"
    assert abs(four["figures"]["capacity_kept"] - POOL) <= PAGE
    working = four["figures"]["groups"] * four["figures"]["prefix_tokens"]
    assert working > POOL
    obs = four["observations"]["reused_tokens"]
    assert obs["observed"] < obs["baseline"]
    assert four["figures"]["prediction_lead_ms"] >= 0  # written before the first request
    assert measured(four["observations"]["sim_vs_engine_ttft_p50_ms"])
    peer_files = list((through_both.out / "peers").glob("*/eviction-prediction.json"))
    assert len(peer_files) == 1  # its own prediction, beside the first server's


def test_ctxlab_eviction_counts_blocks_from_the_servers_events(through_both):
    # 4 through a server that publishes its KV events (`[[servers]] kv_events`): the evicted
    # blocks counted from BlockRemoved while each order ran, not inferred, and measured like
    # the engine's (verdicts are judged on the first server, llama.cpp, which publishes none)
    four = paged(through_both)["demos"]["eviction"]
    evictions = four["observations"]["evictions"]  # exact counts: no sample, no interval
    assert evictions["why_missing"] is None
    grouped, interleaved = evictions["baseline"], evictions["observed"]
    assert isinstance(grouped, int) and isinstance(interleaved, int)
    # the interleaved order's prefixes overflow the cache: it must evict blocks
    assert interleaved > 0 and interleaved >= grouped
    against_sim = four["observations"]["sim_vs_engine_evictions"]
    assert against_sim["why_missing"] is None
    assert all(isinstance(against_sim[k], int | float) for k in ("baseline", "observed"))
    storage = next(t for t in four["tables"] if t["key"] == "eviction_server_storage")
    server_rows = [r for r in storage["rows"] if r[1] == "server"]
    assert [r[-1] for r in server_rows] == [grouped, interleaved]
    assert any(f"BlockRemoved of {PAGE}-token blocks" in n for n in four["notes"])


def test_ctxlab_chat_and_seven_on_ctxlab(through_both):
    demos = paged(through_both)["demos"]
    through_chat({"demos": demos}, "ctxlab")
    seven_on_the_server({"demos": demos}, 10**6)
