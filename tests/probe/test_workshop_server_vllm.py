"""`ctxlab workshop --quick` with vLLM, the reference deployment, in its `[[servers]]` list:
the session's vLLM (tests/vllm_server.py: SmolLM2, 128-token CPU blocks, a 48-block pool) as
the run's server and the session's `ctxlab serve` (32-token pages) beside it.

Limited to the demonstrations that are cheap on an eager one-thread vLLM (about 100 prompt
tokens a second here): 1 (a prompt of a few pages, sent a few ways) and 3 (the staircase,
which the server summary measures anyway). 2 and 4-7 go through vLLM as well (docs/
deployment.md: the workshop through vLLM), but their prompts cost minutes on it; the run
through llama.cpp and ctxlab serve (test_workshop_server.py) checks them through a server.
The workshop run took 129 s (2026-12-05, load average 12 on 2 cores, both servers already
up; the vLLM start is shared with test_probe_vllm.py). Skipped with the `make vllm` hint
where vLLM's CPU build is absent."""

from __future__ import annotations

import json

import pytest

from tests.probe.test_workshop_server import Run, completed, workshop
from tests.servers import CTXLAB_PAGE, Served
from tests.vllm_server import VLLM, VllmServer

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.model,
    pytest.mark.server,
    pytest.mark.xdist_group(VLLM),
]

CHEAP = "1,3"  # the demonstrations this run sends through vLLM (see the docstring)
SMALLER = "\n[quick.prefix_miss]\nrepeats = 2\n"  # as test_workshop_server.py's


@pytest.fixture(scope="module")
def through_vllm(vllm_server: VllmServer, ctxlab_served: Served, tmp_path_factory) -> Run:
    tmp = tmp_path_factory.mktemp("workshop-vllm")
    config = tmp / "servers.toml"
    config.write_text(
        f'[[servers]]\nlabel = "vllm"\nurl = "{vllm_server.url}"\n\n'
        f'[[servers]]\nlabel = "paged"\nurl = "{ctxlab_served.url}"\n' + SMALLER
    )
    return workshop(tmp / "out", str(config), "--only", CHEAP)


def test_vllm_run_completes_and_names_it(through_vllm: Run, vllm_server: VllmServer):
    results = completed(through_vllm)
    assert results["server"]["engine"] == "vllm"
    probe = {r[0]: r for r in results["servers_table"]["rows"]}
    # reuse granularity: vLLM's 128-token blocks, ctxlab serve's pages; vLLM isolates tenants
    assert probe["vllm"][6] == vllm_server.block_size and probe["paged"][6] == CTXLAB_PAGE
    assert probe["vllm"][5] == "yes" and probe["vllm"][8] == "yes"
    report = (through_vllm.out / "report.md").read_text()
    assert "server: vllm" in report and "paged: ctxlab at" in report


def test_vllm_prefix_miss_reuses_whole_blocks(through_vllm: Run, vllm_server: VllmServer):
    # 1 sized from the probed 128-token page: an exact resend reuses every whole block before
    # the last token, a changed token 0 and another cache_salt nothing
    results = through_vllm.results
    one = results["demos"]["prefix_miss"]
    assert one["status"] == "run", one["summary"]
    rows = {r[0]: r for r in one["tables"][0]["rows"]}
    prompt = results["config"]["prefix_miss"]["prompt_tokens"]
    page = vllm_server.block_size
    assert prompt >= 2 * page  # sized from the probed page, not a 16-token default
    assert rows["exact resend"][2] == (prompt - 1) // page * page
    assert rows["cold"][2] == rows["token 0"][2] == rows["other tenant"][2] == 0
    assert all("vllm" in t["title"] for t in one["tables"])


def test_vllm_page_size_side_by_side(through_vllm: Run, vllm_server: VllmServer):
    # 3: each server's reuse at the same divergence points, vLLM's in whole 128-token blocks
    three = through_vllm.results["demos"]["page_size"]
    side = next(t for t in three["tables"] if t["key"] == "page_size_servers_reuse")
    assert [c["name"] for c in side["columns"]] == [
        "diverges at token", "reused on vllm", "reused on paged"
    ]  # fmt: skip
    page = vllm_server.block_size
    assert all(r[1] == r[0] // page * page and r[2] == r[0] // CTXLAB_PAGE * CTXLAB_PAGE
               for r in side["rows"])  # fmt: skip
    assert any(r[0] >= page for r in side["rows"])  # past one vLLM block


def test_vllm_and_ctxlab_side_by_side_for_one(through_vllm: Run):
    # the second server's own pass of 1, and one comparison table with a column each
    peer = through_vllm.results["peers"]["paged"]
    assert peer["engine"] == "ctxlab" and peer["demos"]["prefix_miss"]["status"] == "run"
    report = (through_vllm.out / "report.md").read_text()
    title = "Demonstration 1 on every server"
    header = report[report.index(title) :].splitlines()[2]
    assert header.endswith("| the run's server (vllm) | paged |"), header
    assert "sk-" not in json.dumps(through_vllm.results)


def test_a_model_vllm_does_not_serve_is_one_sentence_in_the_workshop(
    vllm_server: VllmServer, tmp_path
):
    config = tmp_path / "servers.toml"
    config.write_text(
        f'[[servers]]\nlabel = "vllm"\nurl = "{vllm_server.url}"\nmodel = "no-such-model"\n'
    )
    run = workshop(tmp_path / "out", str(config), "--only", "1")
    assert run.res.code == 2, run.res.err[-2000:]
    last = run.res.err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "does not serve model 'no-such-model'" in last
    assert "Traceback" not in run.res.err
