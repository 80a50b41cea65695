from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.errors import CtxlabError
from ctxlab.policy import make_policy
from ctxlab.policy.base import (
    LayerObs,
    attention_probs,
    budget_tokens,
    group_reduce,
    keep_to_slots,
    parse_budget,
)


def test_parse_budget_tokens_and_ratio():
    assert parse_budget(256) == 256
    assert parse_budget("256") == 256
    assert parse_budget("0.25") == 0.25
    assert parse_budget(256.0) == 256
    assert budget_tokens(0.25, 1000) == 250
    assert budget_tokens(0.001, 10) == 1


@pytest.mark.parametrize("bad", [0, -3, 1.5, 0.0, "abc", "-1", True])
def test_parse_budget_rejects(bad):
    with pytest.raises(CtxlabError):
        parse_budget(bad)


def test_budget_too_small_for_window_is_one_sentence():
    with pytest.raises(CtxlabError, match="too small for snapkv"):
        make_policy("snapkv", budget=16)
    with pytest.raises(CtxlabError, match="too small for streaming"):
        make_policy("streaming", budget=4)


def test_ratio_budget_too_small_at_run_time(lockstep_obs):
    pol = make_policy("snapkv", budget=0.01)
    obs = lockstep_obs(2, 100, obs_attn=torch.rand(2, 32, 100))
    with pytest.raises(CtxlabError, match="too small"):
        pol.on_prefill(obs)


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


def test_keep_to_slots_maps_positions_of_a_compacted_lane():
    pos = torch.tensor([0, 3, 7, 9, -1, -1])
    assert keep_to_slots(pos, torch.tensor([3, 9])).tolist() == [1, 3]
    with pytest.raises(RuntimeError):
        keep_to_slots(pos, torch.tensor([4]))


NAMES = ["window", "streaming", "h2o", "snapkv", "pyramidkv", "tova", "longformer", "bigbird"]


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    n_kv=st.integers(1, 3),
    group=st.integers(1, 3),
    length=st.integers(1, 300),
    budget=st.integers(40, 200),
    layer=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_keep_sets_respect_budget_and_forced_tokens(name, n_kv, group, length, budget, layer, seed):
    torch.manual_seed(seed)
    params = {"local": budget - 8, "n_global": 4} if name in ("longformer", "bigbird") else {}
    pol = make_policy(name, None if params else budget, **params)
    n_heads = n_kv * group
    obs = LayerObs(
        layer=layer,
        n_layers=4,
        n_heads=n_heads,
        positions=torch.arange(length).repeat(n_kv, 1),
        seq_len=length,
        prompt_len=length,
        obs_attn=torch.softmax(torch.randn(n_heads, 32, length), -1),
        acc_attn=torch.rand(n_kv, length),
    )
    keep = pol.on_prefill(obs)
    lane_budget = pol.lane_budget(obs)
    if length <= lane_budget:
        assert keep is None
        return
    assert keep is not None and len(keep) == n_kv
    for k in keep:
        assert len(k) <= lane_budget
        assert torch.all(k[1:] > k[:-1]), "kept positions are sorted and distinct"
        assert int(k.min()) >= 0 and int(k.max()) < length
        kept = set(k.tolist())
        sinks = set(range(min(pol.n_sinks(), length)))
        recent = set(range(max(0, length - pol.n_recent(lane_budget)), length))
        assert sinks <= kept and recent <= kept
        if name not in ("longformer", "bigbird"):
            assert len(k) == lane_budget
