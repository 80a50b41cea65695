"""The step plan is plain data built before the forward: the kernel is chosen once per step,
each decode read names its path and attention runs that path without choosing again."""

from __future__ import annotations

import dataclasses

import pytest
from engine_toy_model import CFG, ToyModel, one_torch_thread, oracle_greedy  # noqa: F401

import ctxlab.engine.attention as attention
import ctxlab.engine.runner as runner
from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.engine.decode_attention import torch_decode
from ctxlab.engine.kernels import paged_decode
from ctxlab.engine.step_plan import StepPlan

MODEL = ToyModel()
PROMPTS = [[3, 9, 27, 31, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], [7, 1, 8, 2], [11] * 23]


def _engine() -> LLMEngine:
    return LLMEngine(MODEL, CFG, kv_pool_tokens=1024, block_size=4, max_num_seqs=8)


def _run(eng: LLMEngine) -> list[list[int]]:
    """Greedy tokens of every prompt, batched (prefill, mixed and decode steps)."""
    rids = [eng.add_request(p, SamplingParams(max_tokens=6)) for p in PROMPTS]
    return [out.token_ids for out in eng.run_all(rids)]


def _capture_plans(monkeypatch) -> list[StepPlan]:
    plans: list[StepPlan] = []
    begin = attention.PagedAttention.begin_step

    def spy(self, plan):
        plans.append(plan)
        begin(self, plan)

    monkeypatch.setattr(attention.PagedAttention, "begin_step", spy)
    return plans


def test_the_plan_is_frozen_and_every_read_names_its_path(monkeypatch):
    plans = _capture_plans(monkeypatch)
    calls = []
    monkeypatch.setattr(runner, "kernel_serves", lambda pool: calls.append(pool) or False)
    assert _run(_engine()) == [oracle_greedy(MODEL, p, 6) for p in PROMPTS]
    with_decode = [p for p in plans if p.decode_idx is not None]
    assert with_decode and len(calls) == len(with_decode)  # once per step with decode rows
    for plan in with_decode:
        assert len(plan.decode) == CFG.num_layers
        paths = {r.path for reads in plan.decode for r in reads}
        assert paths and paths <= {"in-place", "gather"}
        with pytest.raises(dataclasses.FrozenInstanceError):
            plan.decode_idx = None  # type: ignore[misc]
    prefill_only = [p for p in plans if p.decode_idx is None]
    assert prefill_only and all(not p.decode for p in prefill_only)


def test_attention_runs_the_kernel_the_plan_chose_without_choosing_again(monkeypatch):
    """With the kernel chosen for the step, every decode read goes to `run_kernel` (here a
    stand-in that runs the reference), and nothing during the forward asks whether the kernel
    serves: the answer is the plan's."""
    plans = _capture_plans(monkeypatch)
    ran = []

    def fake_kernel(q, pool, table, mask=None, length=None):
        ran.append(table.shape)
        return torch_decode(q, pool, table, mask, length)[0]

    def no_decision():
        raise AssertionError("the kernel was chosen again during the forward")

    eng = _engine()  # built first: building warms the kernel up, which decides
    monkeypatch.setattr(runner, "kernel_serves", lambda pool: True)
    monkeypatch.setattr(attention, "run_kernel", fake_kernel)
    monkeypatch.setattr(paged_decode, "_decide", no_decision)
    assert _run(eng) == [oracle_greedy(MODEL, p, 6) for p in PROMPTS]
    reads = [r for p in plans for layer in p.decode for r in layer]
    assert reads and {r.path for r in reads} == {"kernel"}
    assert len(ran) == len(reads)
