"""`ctxlab serve --step-log`: every step the server ran, with the load counts a step profile
prices, so the log's lines add up to what the requests computed and fit like a profile."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from typer.testing import CliRunner

from ctxlab.cli import app
from ctxlab.engine import LLM
from ctxlab.errors import CtxlabError
from ctxlab.sim.steptime import PROFILE_FORMAT, ProfileStepTime
from tests.serve.conftest import in_process

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.model
def test_the_log_adds_up_to_what_the_requests_computed(loaded, tmp_path):
    log = tmp_path / "steps.jsonl"
    llm = LLM(loaded, block_size=16, kv_pool_tokens=2048, max_num_batched_tokens=64)
    prompts = [loaded.tokenizer.encode(f"{w} " * 90)[:90] for w in ("river", "stone", "cloud")]
    outputs = 5

    def ask(ids: list[int]) -> dict:
        body = {"model": "m", "prompt": ids, "max_tokens": outputs, "ignore_eos": True}
        r = httpx.post(f"{url}/v1/completions", json={**body, "temperature": 0}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["usage"]

    with in_process(llm.engine, step_log=log) as url, ThreadPoolExecutor(3) as pool:
        usages = list(pool.map(ask, prompts))
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines, "no step was logged"
    # 90-token prompts through a 64-token budget: chunks, and decodes beside them
    assert {x["kind"] for x in lines} >= {"prefill", "decode"}
    computed = sum(u["prompt_tokens"] - (u.get("prompt_tokens_details") or {}).get(
        "cached_tokens", 0) for u in usages)  # fmt: skip
    assert sum(x["prefill_tokens"] for x in lines) == computed
    # the first token of each request comes from its prefill step, the rest from decodes
    assert sum(x["decode_tokens"] for x in lines) == len(prompts) * (outputs - 1)
    assert all(x["prefill_tokens"] <= 64 for x in lines)
    assert lines[0]["idle_before"] is None
    assert all(x["idle_before"] >= 0 and x["seconds"] > 0 for x in lines[1:])
    starts = [x["start"] for x in lines]
    assert starts == sorted(starts)
    # the lines are steps of the profile format: a replay's own steps fit like a profile
    profile = tmp_path / "replay-profile.json"
    profile.write_text(json.dumps({"format": PROFILE_FORMAT, "steps": lines}))
    assert ProfileStepTime(profile).coef.shape == (5,)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--step-log", "steps.txt"], "--step-log steps.txt must end in .jsonl"),
        (["--step-log", "s.jsonl", "--disaggregated"], "records one colocated engine"),
    ],
)
def test_bad_step_log_options_fail_before_the_model_loads(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["serve", *args])
    assert isinstance(res.exception, CtxlabError), res.output
    assert needle in str(res.exception)
