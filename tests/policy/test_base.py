from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_cases import build, evicting_names

from ctxlab.errors import CtxlabError
from ctxlab.kv.manager import KVCacheManager
from ctxlab.policy import PolicyWrapper, ScorerPolicy, make_policy
from ctxlab.policy.budget import Budget
from ctxlab.policy.observation import LayerObs, attention_probs, group_reduce


def test_budget_tokens_and_ratio_are_told_apart_by_spelling():
    assert Budget.parse(256) == Budget.parse("256") == Budget(tokens=256)
    assert Budget.parse("0.25") == Budget.parse(0.25) == Budget(ratio=0.25)
    # A trailing ".0" never turns a ratio into a token count: 1.0 is the whole prompt.
    assert Budget.parse(1.0) == Budget.parse("1.0") == Budget(ratio=1.0)
    assert Budget.parse(1) == Budget(tokens=1)
    assert Budget(ratio=1.0).tokens_for(1000) == 1000
    assert Budget(ratio=0.25).tokens_for(1000) == 250
    assert Budget(ratio=0.001).tokens_for(10) == 1
    assert Budget(tokens=64).tokens_for(10) == 64
    assert str(Budget(tokens=64)) == "64" and str(Budget(ratio=0.5)) == "0.5"


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (0, "positive"),
        (-5, "positive"),
        ("-5", "positive"),
        ("-0.5", "positive"),
        ("0.0", "positive"),
        ("2.0", "decimal point"),
        (2.0, "decimal point"),
        (256.0, "decimal point"),
        (1.5, "decimal point"),
        ("abc", "neither"),
        (True, "token count"),
    ],
)
def test_bad_budgets_are_one_sentence(bad, says):
    with pytest.raises(CtxlabError, match=says) as err:
        Budget.parse(bad)
    text = str(err.value)
    assert not re.search(r"\.\s+[A-Z]", text) and text.endswith("."), "one sentence"
    if says == "positive":
        assert text.startswith("budgets are positive"), "not a sentence about ratios"


@pytest.mark.parametrize("name", ["full", "quant"])
def test_a_policy_without_a_budget_refuses_one(name):
    with pytest.raises(CtxlabError, match="no budget"):
        make_policy(name, 256)
    make_policy(name)  # and builds without one


def test_knorm_at_ratio_one_keeps_the_whole_prompt(lockstep_obs):
    """The case that went wrong: 1.0 read as one token kept a single key per lane."""
    pol = make_policy("knorm", "1.0")
    obs = lockstep_obs(2, 100, keys=torch.randn(2, 100, 8))
    assert pol.on_prefill(obs) is None  # nothing over budget: every prompt token stays
    keep = make_policy("knorm", "0.5").on_prefill(obs)
    assert keep is not None and [len(k) for k in keep] == [50, 50]


def test_budgets_of_window_patterns_are_the_whole_budget():
    lf = make_policy("longformer", 100)
    assert (lf.local, lf.budget) == (96, Budget(tokens=100))
    bb = make_policy("bigbird", 100)
    assert bb.local + bb.n_global + bb.n_random == 100 and bb.budget == Budget(tokens=100)
    with pytest.raises(CtxlabError, match="too small for bigbird"):
        make_policy("bigbird", 60)
    with pytest.raises(CtxlabError, match="in tokens"):
        make_policy("longformer", 0.5)


def test_budget_too_small_for_window_is_one_sentence():
    with pytest.raises(CtxlabError, match="too small for snapkv"):
        make_policy("snapkv", budget=16)
    with pytest.raises(CtxlabError, match="too small for streaming"):
        make_policy("streaming", budget=4)


def test_a_ratio_budget_under_the_floor_is_lifted_to_it(lockstep_obs):
    """Issue 33: 1 % of 100 tokens is under SnapKV's 32-token window; the budget is lifted to
    the window (a token budget that small is refused when the policy is made)."""
    pol = make_policy("snapkv", budget=0.01)
    window = pol.n_recent(1)
    obs = lockstep_obs(2, 100, obs_attn=torch.rand(2, window, 100))
    kept = pol.on_prefill(obs)
    assert kept is not None and [len(k) for k in kept] == [window, window]
    assert all(k[-window:].tolist() == list(range(100 - window, 100)) for k in kept)
    short = lockstep_obs(2, window, obs_attn=torch.rand(2, window, window))
    assert pol.on_prefill(short) is None  # a prompt as short as the floor passes untouched
    with pytest.raises(CtxlabError, match="too small"):
        make_policy("snapkv", budget=window - 1)


def test_group_reduce_consecutive_heads():
    x = torch.arange(6.0).view(6, 1)  # 6 query heads, 2 KV heads -> groups {0,1,2} {3,4,5}
    assert group_reduce(x, 2, "sum").flatten().tolist() == [3.0, 12.0]
    assert group_reduce(x, 2, "max").flatten().tolist() == [2.0, 5.0]


def test_attention_probs_causal_and_padding():
    torch.manual_seed(0)
    keys = torch.randn(1, 5, 4)
    pos = torch.tensor([[0, 1, 2, 3, -1]])
    p = attention_probs(torch.randn(2, 2, 4), keys, pos, torch.tensor([2, 3]))
    assert p.shape == (2, 2, 5)
    assert torch.all(p[:, 0, 3:] == 0) and torch.all(p[:, :, 4] == 0)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 2))


def test_slots_of_maps_positions_of_a_compacted_lane():
    pos = torch.tensor([[0, 3, 7, 9, -1, -1], [1, 2, 5, 6, 8, 11]])
    got = KVCacheManager.slots_of(pos, [torch.tensor([3, 9]), torch.tensor([1, 6, 11])])
    assert [g.tolist() for g in got] == [[1, 3], [0, 3, 5]]
    for bad in ([torch.tensor([4]), torch.tensor([1])], [torch.tensor([3]), torch.tensor([12])]):
        with pytest.raises(RuntimeError):
            KVCacheManager.slots_of(pos, bad)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(evicting_names()),
    n_kv=st.integers(1, 3),
    group=st.integers(1, 3),
    length=st.integers(1, 300),
    budget=st.integers(40, 200),
    layer=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_keep_sets_respect_budget_and_forced_tokens(name, n_kv, group, length, budget, layer, seed):
    """Every registered policy that evicts, shown every tensor a layer view can carry."""
    torch.manual_seed(seed)
    pol = build(name, budget)
    n_heads = n_kv * group
    obs = LayerObs(
        layer=layer,
        n_layers=4,
        n_heads=n_heads,
        positions=torch.arange(length).repeat(n_kv, 1),
        seq_len=length,
        prompt_len=length,
        keys=torch.randn(n_kv, length, 8),
        obs_attn=torch.softmax(torch.randn(n_heads, 32, length), -1),
        acc_attn=torch.rand(n_kv, length),
    )
    keep = pol.on_prefill(obs)
    lane_budget = pol.lane_budget(obs)
    assert lane_budget is not None
    if length <= lane_budget:
        assert keep is None
        return
    assert keep is not None and len(keep) == n_kv
    scorer = pol.base if isinstance(pol, PolicyWrapper) else pol
    assert isinstance(scorer, ScorerPolicy)
    for k in keep:
        assert len(k) <= lane_budget
        assert torch.all(k[1:] > k[:-1]), "kept positions are sorted and distinct"
        assert int(k.min()) >= 0 and int(k.max()) < length
        kept = set(k.tolist())
        sinks = set(range(min(scorer.n_sinks(), length)))
        recent = set(range(max(0, length - scorer.n_recent(lane_budget)), length))
        assert sinks <= kept and recent <= kept
        if name not in ("longformer", "bigbird"):  # their local window is the budget's rest
            assert len(k) == lane_budget
