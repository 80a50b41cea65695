"""The probe against real servers on loopback: `ctxlab serve` at two page sizes (paged,
shared blocks) and llama.cpp's server (one cached prompt per slot). What each reports is
checked against how the server was configured.

Page 32 and llama.cpp are the session's shared servers (tests/servers.py): the probe draws
fresh random prompts on every run, and the capacity section fills a least-recently-used
cache whose earlier contents no other test reads back, so sharing changes no answer."""

from __future__ import annotations

import pytest

from ctxlab.probe.runner import ProbeConfig, run
from ctxlab.probe.steptime import ProfileDesign
from tests.probe.conftest import ctxlab_serve
from tests.servers import CTXLAB_PAGE, CTXLAB_POOL, LLAMACPP_CTX, LLAMACPP_SLOTS, SHARED

POOL = CTXLAB_POOL

pytestmark = [pytest.mark.server, pytest.mark.xdist_group(SHARED)]


@pytest.fixture(scope="module", params=[16, CTXLAB_PAGE], ids=["page16", "page32"])
def paged(request, serve_model):
    if request.param == CTXLAB_PAGE:
        yield request.getfixturevalue("ctxlab_server"), CTXLAB_PAGE
        return
    # its own server: a second page size, so the staircase is seen to follow the server's
    # page rather than one constant (the shared server has 32)
    args = ("--page-size", str(request.param), "--kv-pool-tokens", str(POOL),
            "--metrics-prefix", "vllm")  # fmt: skip
    with ctxlab_serve(*args) as url:
        yield url, request.param


def _figures(report, section):
    return {f.name: f for f in report.sections[section]}


@pytest.mark.model
def test_page_size_is_the_staircase_step(paged):
    url, page = paged
    rep = run(ProbeConfig(url, sections=("prefix",), longest=110))
    f = _figures(rep, "prefix caching")
    assert f["prefix caching"].value is True and f["prefix caching"].how == "measured"
    assert f["cache granularity"].value == page and f["cache granularity"].how == "measured"
    assert f["kind of cache"].value == f"shared pages of {page} tokens"
    assert all(p["cached"] == p["position"] // page * page for p in rep.details["staircase"])


@pytest.mark.model
def test_capacity_within_one_page_of_the_pool(paged):
    url, page = paged
    rep = run(ProbeConfig(url, sections=("prefix", "capacity"), longest=3 * page))
    f = _figures(rep, "capacity")
    cap = f["prefix-cache capacity"]
    assert cap.how == "measured", cap
    assert abs(cap.value - POOL) <= page
    pub = f["capacity published in /metrics"]
    assert pub.value == POOL and "vllm:cache_config_info" in pub.note
    # vLLM's metric names, but not vLLM: the planner's vLLM model must not be applied
    predicted = f["capacity predicted by the planner"]
    assert predicted.how == "not measurable" and "--kv-pool-tokens" in predicted.note
    verdict = f["capacity: which figure disagrees"]
    assert verdict.value == "none" and "published and the measured" in verdict.note


@pytest.mark.model
def test_cache_salt_isolates_on_ctxlab_serve(paged):
    url, page = paged
    if page != 16:
        pytest.skip("one page size is enough for isolation")
    rep = run(ProbeConfig(url, sections=("isolation",)))
    f = _figures(rep, "isolation")["cache_salt isolates"]
    assert f.value is True and f.how == "measured"
    assert rep.details["isolation"]["other salt"] == 0 and rep.details["isolation"]["same salt"] > 0


@pytest.mark.model
def test_step_profile_loads_in_the_simulator(paged, tmp_path):
    url, page = paged
    if page != 16:
        pytest.skip("one page size is enough for the profile")
    import json

    from ctxlab.sim.steptime import ProfileStepTime

    design = ProfileDesign((32, 96), 2, (48,), (1, 3), 6, 2, 64, (32, 96))
    rep = run(ProbeConfig(url, sections=("profile",), profile_design=design))
    doc = rep.details["profile"]
    kinds = {s["kind"] for s in doc["steps"]}
    assert {"prefill", "decode"} <= kinds <= {"prefill", "decode", "mixed"}
    # each mixed step either landed beside the 2 decodes or says why it did not
    mixed = [s for s in doc["steps"] if s["kind"] == "mixed"]
    assert all(s["decode_tokens"] == 2 and s["prefill_tokens"] > 0 for s in mixed)
    said = [m for m in rep.details["profile missing"] if m.startswith("mixed step")]
    assert len(mixed) + len(said) == 2
    assert all(s["seconds"] > 0 for s in doc["steps"])
    assert {s["decode_tokens"] for s in doc["steps"] if s["kind"] == "decode"} == {1, 3}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    assert ProfileStepTime(path).coef.shape == (5,)


@pytest.fixture(scope="module")
def llama(serve_model, llamacpp_server):
    return llamacpp_server


@pytest.mark.model
def test_llamacpp_is_token_granular_one_prompt_per_slot(llama):
    rep = run(ProbeConfig(llama, sections=("prefix", "capacity"), longest=60))
    assert rep.server.engine == "llama.cpp" and rep.server.slots == LLAMACPP_SLOTS == 2
    f = _figures(rep, "prefix caching")
    assert f["cache granularity"].value == 1 and f["cache granularity"].how == "measured"
    assert "slot" in f["kind of cache"].value
    assert all(p["cached"] == p["position"] for p in rep.details["staircase"])
    # whole prompts, one per slot: the sentinel survives one filler prompt, not two
    cap = _figures(rep, "capacity")["prefix-cache capacity"]
    assert (cap.value, cap.how) == ("2 prompts", "inferred")
    assert _figures(rep, "capacity")["capacity published in /props"].value == LLAMACPP_CTX == 4096


@pytest.mark.model
def test_llamacpp_does_not_isolate_by_salt(llama):
    rep = run(ProbeConfig(llama, sections=("isolation",)))
    f = _figures(rep, "isolation")["cache_salt isolates"]
    assert f.value is False and f.how == "measured"
    assert "does not isolate" in f.note
    assert rep.details["isolation"]["other salt"] > 0
