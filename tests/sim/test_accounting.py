"""Conservation, the offline reuse count, monotonicity: the simulator's must-shows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.errors import CtxlabError
from ctxlab.plan.units import GIB
from ctxlab.sim.config import SimConfig
from ctxlab.sim.run import simulate
from ctxlab.sim.synthetic import SyntheticSpec, generate
from ctxlab.sim.trace import Trace, read_mooncake

from .conftest import real_trace


def offline_reused_tokens(trace: Trace, page: int) -> int:
    """Longest prefix each request shares with any earlier one, token by token, rounded
    down to whole pages and capped so one token is always computed.

    This counts every earlier request's blocks as available, i.e. computed before the
    request is admitted. The simulator (like the engine) shares a block only once it is
    computed, so it reaches this count exactly when each request is admitted after the
    earlier ones finished their prefill (one request at a time) and stays at or below it
    otherwise; tests/sim/test_commit.py pins the concurrent case.
    """
    B = trace.block_tokens
    longest_block: dict[int, int] = {}  # hash id -> most tokens any earlier request had in it
    total = 0
    for r in trace.requests:
        lengths = [min(B, r.input_len - i * B) for i in range(len(r.hash_ids))]
        shared = 0
        for h, own in zip(r.hash_ids, lengths, strict=True):
            seen = longest_block.get(h, 0)
            shared += min(seen, own) // page * page
            if seen < own:
                break
        total += min(shared, (r.input_len - 1) // page * page)
        for h, own in zip(r.hash_ids, lengths, strict=True):
            longest_block[h] = max(longest_block.get(h, 0), own)
    return total


SHARING = SyntheticSpec(
    n=120,
    rate=20.0,
    groups=3,
    prefix=1000,
    turns=3,
    think=2.0,
    input="uniform:50:1500",
    output="uniform:1:200",
    seed=7,
)


def test_conservation_under_pressure(llama8b, h100):
    trace = generate(SHARING)
    res = simulate(trace, llama8b, h100, SimConfig(pool_bytes=GIB), check=True)
    m, c = res.metrics, res.counters
    assert m["preemptions"] > 0 and m["evictions"] > 0  # the pool really was under pressure
    assert sorted(s.req.index for s in res.seqs) == list(range(len(trace)))
    assert all(s.generated == s.req.output_len for s in res.seqs)
    assert c.tokens_emitted == trace.output_tokens
    assert c.queried_tokens == trace.input_tokens == c.reused_tokens + c.computed_tokens
    assert c.prefill_tokens_run > c.computed_tokens  # preemption cost recompute work
    assert all(s.first_token <= s.finish and s.arrival <= s.admitted_at for s in res.seqs)


def test_no_preemption_means_no_extra_prefill(llama8b, h100):
    trace = generate(SHARING)
    res = simulate(trace, llama8b, h100, SimConfig(unlimited=True), check=True)
    c = res.counters
    assert c.preemptions == 0 and c.prefill_tokens_run == c.computed_tokens
    # every token is emitted by a decode step or by a finishing prefill
    assert c.decode_tokens_run + len(trace) == c.tokens_emitted == trace.output_tokens


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    groups=st.integers(0, 4),
    turns=st.integers(1, 4),
    page=st.sampled_from([1, 16, 64, 512]),
)
def test_unlimited_cache_matches_offline_count(llama8b, h100, seed, groups, turns, page):
    spec = SyntheticSpec(
        n=60,
        rate=50.0,
        groups=groups,
        prefix=700,
        turns=turns,
        think=0.5,
        input="lognormal:600:1.0",
        output="uniform:1:40",
        seed=seed,
    )
    trace = generate(spec)
    offline = offline_reused_tokens(trace, page)
    one_at_a_time = SimConfig(unlimited=True, page_size=page, max_running=1)
    assert simulate(trace, llama8b, h100, one_at_a_time).counters.reused_tokens == offline
    concurrent = simulate(trace, llama8b, h100, SimConfig(unlimited=True, page_size=page))
    assert concurrent.counters.reused_tokens <= offline


@pytest.mark.parametrize("name", ["conversation", "synthetic"])
def test_unlimited_cache_matches_offline_count_on_real_traces(llama8b, h100, name):
    trace = read_mooncake(real_trace(name))
    trace.requests = trace.requests[:1500]
    offline = offline_reused_tokens(trace, 16)
    one_at_a_time = SimConfig(unlimited=True, page_size=16, max_running=1)
    assert simulate(trace, llama8b, h100, one_at_a_time).counters.reused_tokens == offline
    concurrent = simulate(trace, llama8b, h100, SimConfig(unlimited=True, page_size=16))
    assert 0 < concurrent.counters.reused_tokens <= offline


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reuse_never_falls_as_the_pool_grows(llama8b, h100, seed):
    trace = generate(SHARING.__class__(**{**SHARING.__dict__, "seed": seed}))
    fractions = [
        simulate(trace, llama8b, h100, SimConfig(pool_bytes=int(g * GIB))).metrics[
            "reused_token_fraction"
        ]
        for g in (1, 1.5, 2, 3, 4, 8)
    ]
    unlimited = simulate(trace, llama8b, h100, SimConfig(unlimited=True))
    fractions.append(unlimited.metrics["reused_token_fraction"])
    assert fractions == sorted(fractions), fractions
    assert fractions[0] < fractions[-1]


@pytest.mark.parametrize("pool", [None, GIB, 2 * GIB])
def test_smaller_page_never_lowers_reuse(llama8b, h100, pool):
    trace = generate(SHARING)
    cfg = SimConfig(unlimited=pool is None, pool_bytes=pool)
    fractions = [
        simulate(trace, llama8b, h100, cfg.with_(page_size=p)).metrics["reused_token_fraction"]
        for p in (256, 64, 16, 1)
    ]
    assert fractions == sorted(fractions), fractions


def test_offload_tier_turns_recompute_into_transfer(llama8b, h100):
    trace = generate(SHARING)
    base = simulate(trace, llama8b, h100, SimConfig(pool_bytes=GIB), check=True)
    tier = simulate(
        trace, llama8b, h100, SimConfig(pool_bytes=GIB, offload_bytes=8 * GIB), check=True
    )
    assert tier.metrics["reused_from_tier_tokens"] > 0
    assert tier.metrics["offload_transfer_bytes"] > 0
    assert tier.counters.reused_tokens > base.counters.reused_tokens
    assert tier.counters.computed_tokens < base.counters.computed_tokens


def test_offload_latency_delays_restored_requests_only(llama8b, h100):
    trace = generate(SHARING)
    cfg = SimConfig(pool_bytes=GIB, offload_bytes=8 * GIB)
    fast = simulate(trace, llama8b, h100, cfg, check=True)
    slow = simulate(trace, llama8b, h100, cfg.with_(offload_latency=0.5), check=True)
    assert slow.metrics["reused_from_tier_tokens"] > 0
    assert slow.metrics["ttft_p50"] >= fast.metrics["ttft_p50"]
    assert slow.metrics["ttft_p99"] > fast.metrics["ttft_p99"]
    with pytest.raises(CtxlabError, match="offload latency"):
        cfg.with_(offload_latency=-1.0)
