"""A prefix block is a cache hit once it is computed, or once the step a request is admitted
for computes it, as in the engine.

The engine admits a waiting request only while the step's token budget has tokens left
after the running requests, registers a full block in its prefix cache after the step that
wrote it, and lets a request admitted for a step take the full blocks that requests before it
in that step write. So a request admitted in the same step as a group-mate with the same new
prefix reuses the blocks the group-mate writes then; one that waited for the budget reuses
the blocks committed before and those finished by the step it is admitted in; one that
arrives after the group-mate's prefill reuses the whole prefix. These scenarios are checked
here on the simulator and, with the same numbers, on the real engine in
`test_commit_engine.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxlab.sim.config import SimConfig
from ctxlab.sim.run import simulate
from ctxlab.sim.trace import Request, Trace

PAGE = 16  # the engine's block; the trace's hash block too, so blocks map one to one
PREFIX = 240  # 15 full blocks both prompts share
SUFFIX = 8  # each prompt's own tail (its last block is partial: never shared)
OUTPUT = 4


@dataclass(frozen=True)
class Scenario:
    name: str
    budget: int  # prefill token budget per step (max_num_batched_tokens / chunk_tokens)
    after_prefill: bool  # the second request arrives once the first has its first token
    reused: tuple[int, int]  # prompt tokens each request takes from the prefix cache


SCENARIOS = [
    # 512 tokens hold both prompts: both admitted in step 1, the second after the first,
    # whose prefill writes the 15 shared blocks in that step: the prefix is computed once
    Scenario("same step", 512, False, (0, PREFIX)),
    # the first prompt fills steps 1-2 (100 + 100 tokens); the second is admitted beside
    # its last chunk in step 3 and finds the 12 blocks (192 tokens) committed by then and
    # the 3 that chunk completes
    Scenario("waits for the budget", 100, False, (0, PREFIX)),
    # arriving after the first request's prefill: the whole shared prefix is committed
    Scenario("after prefill", 512, True, (0, PREFIX)),
]


def prompts() -> list[list[int]]:
    """Two prompts (token ids) with the same 240-token prefix and different tails."""
    prefix = [1000 + i for i in range(PREFIX)]
    return [prefix + [20000 + 100 * k + i for i in range(SUFFIX)] for k in range(2)]


def sim_reused(scenario: Scenario, llama8b, h100) -> list[int]:
    def request(k: int, arrival: float) -> Request:
        own = tuple(10_000 * (k + 1) + b for b in range(1))  # the partial tail block
        hashes = tuple(range(PREFIX // PAGE)) + own
        return Request(k, arrival, PREFIX + SUFFIX, OUTPUT, hashes)

    config = SimConfig(page_size=PAGE, chunk_tokens=scenario.budget, max_running=8, unlimited=True)
    arrival = 0.0
    if scenario.after_prefill:
        alone = simulate(Trace("first", [request(0, 0.0)], PAGE), llama8b, h100, config)
        arrival = alone.seqs[0].first_token
    trace = Trace(scenario.name, [request(0, 0.0), request(1, arrival)], PAGE)
    res = simulate(trace, llama8b, h100, config, check=True)
    return [s.reused for s in sorted(res.seqs, key=lambda s: s.req.index)]


def test_the_prompts_match_the_scenarios():
    a, b = prompts()
    assert len(a) == len(b) == PREFIX + SUFFIX and a[:PREFIX] == b[:PREFIX]
    assert a[PREFIX] != b[PREFIX] and PREFIX % PAGE == 0


def test_same_step_computes_its_own_copy(llama8b, h100):
    assert sim_reused(SCENARIOS[0], llama8b, h100) == list(SCENARIOS[0].reused)


def test_admitted_mid_prefill_reuses_the_blocks_finished_so_far(llama8b, h100):
    assert sim_reused(SCENARIOS[1], llama8b, h100) == list(SCENARIOS[1].reused)


def test_after_prefill_reuses_the_whole_prefix(llama8b, h100):
    assert sim_reused(SCENARIOS[2], llama8b, h100) == list(SCENARIOS[2].reused)
