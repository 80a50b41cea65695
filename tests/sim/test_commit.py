"""A prefix block is a cache hit only once it is computed (committed), as in the engine.

The engine registers a full block in its prefix cache after the step that wrote it, so a
request admitted in the same step as a group-mate with the same new prefix computes its own
copy, and one admitted later reuses exactly the blocks finished by then. The simulator must
predict the same reuse.
"""

from __future__ import annotations

from ctxlab.sim.config import SimConfig
from ctxlab.sim.run import simulate
from ctxlab.sim.trace import Request, Trace

BLOCK = 64  # tokens per trace hash block (4 pages of 16)
PREFIX = 4096  # 64 shared blocks
CHUNK = 1024  # prefill token budget per step: the first request's prefill takes 4 steps
CONFIG = SimConfig(page_size=16, chunk_tokens=CHUNK, unlimited=True)


def two_requests(second_arrival: float) -> Trace:
    """Two prompts that share a 4,096-token prefix, each with its own 1,000-token suffix."""
    shared = tuple(range(PREFIX // BLOCK))

    def request(index: int, arrival: float, own: int) -> Request:
        mine = tuple(range(own, own + 16))  # 1,000 tokens: 15 full blocks and a partial one
        return Request(index, arrival, PREFIX + 1000, 8, shared + mine)

    return Trace("two", [request(0, 0.0, 1000), request(1, second_arrival, 2000)], BLOCK)


def reused(trace: Trace, llama8b, h100) -> list[int]:
    res = simulate(trace, llama8b, h100, CONFIG, check=True)
    return [s.reused for s in sorted(res.seqs, key=lambda s: s.req.index)]


def first_request_steps(llama8b, h100) -> list[float]:
    """End times of the first request's steps when it runs alone."""
    alone = Trace("one", two_requests(0.0).requests[:1], BLOCK)
    return simulate(alone, llama8b, h100, CONFIG).timeline.time


def test_admitted_in_the_same_step_it_computes_its_own_copy(llama8b, h100):
    assert reused(two_requests(0.0), llama8b, h100) == [0, 0]


def test_admitted_after_the_prefill_it_reuses_the_whole_prefix(llama8b, h100):
    prefill_end = first_request_steps(llama8b, h100)[4]  # 5,096 tokens: 5 chunks
    assert reused(two_requests(prefill_end), llama8b, h100) == [0, PREFIX]


def test_admitted_mid_prefill_it_reuses_the_blocks_finished_so_far(llama8b, h100):
    ends = first_request_steps(llama8b, h100)
    for done_steps in (1, 2, 3):
        # arriving as step `done_steps` ends: admitted before the next step starts
        got = reused(two_requests(ends[done_steps - 1]), llama8b, h100)
        assert got == [0, done_steps * CHUNK], done_steps
    # arriving during the first step: admitted when it ends (as the engine's loop does),
    # so it finds that step's blocks committed
    assert reused(two_requests(ends[0] * 0.5), llama8b, h100) == [0, CHUNK]
