"""The scenarios of `test_commit.py` on the real engine: the simulator's reuse figures are
the engine's (skipped, by the shared `loaded` fixture, when the default model is absent)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from ctxlab.engine.sampling import SamplingParams

from .test_commit import OUTPUT, PAGE, SCENARIOS, Scenario, prompts


def engine_reused(loaded, scenario: Scenario) -> list[int]:
    from ctxlab.engine import LLMEngine

    engine = LLMEngine(
        loaded.model,
        loaded.config,
        loaded.tokenizer,
        kv_pool_tokens=1024,
        block_size=PAGE,
        max_num_batched_tokens=scenario.budget,
        max_num_seqs=8,
    )
    params = SamplingParams(max_tokens=OUTPUT, ignore_eos=True)
    first, second = prompts()
    rids = [engine.add_request(first, params)]
    if scenario.after_prefill:
        while engine.output(rids[0]).metrics.first_token_time is None:
            engine.step()
    rids.append(engine.add_request(second, params))
    while engine.has_unfinished():
        engine.step()
    return [engine.output(r).metrics.reused_tokens for r in rids]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_engine_reuses_what_the_simulator_predicts(loaded, scenario):
    assert engine_reused(loaded, scenario) == list(scenario.reused)
