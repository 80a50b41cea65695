"""Each eviction policy keeps what its definition says on hand-built attention patterns."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.policy import make_policy
from ctxlab.policy.observation import LayerObs
from ctxlab.policy.pyramidkv import pyramid_budgets
from ctxlab.policy.snapkv import snap_scores


def test_window_keeps_the_last_w(lockstep_obs):
    keep = make_policy("window", budget=10).on_prefill(lockstep_obs(2, 50))
    assert all(k.tolist() == list(range(40, 50)) for k in keep)


def test_streaming_keeps_first_n_and_last(lockstep_obs):
    pol = make_policy("streaming", budget=12, sinks=4)
    keep = pol.on_prefill(lockstep_obs(3, 100))
    assert all(k.tolist() == [0, 1, 2, 3, *range(92, 100)] for k in keep)
    assert pol.position_mode == "cache-slot"
    assert make_policy("streaming", 12, position_mode="original").position_mode == "original"


def test_h2o_keeps_the_planted_heavy_hitter_and_evicts_lowest_non_recent(lockstep_obs):
    acc = torch.full((2, 40), 1.0)
    acc[0, 5] = 50.0  # heavy hitter of KV head 0
    acc[1, 17] = 50.0  # another one for head 1
    acc[:, 30:] = 0.0  # recent tokens have the lowest scores but are protected
    acc[0, 8] = 0.5  # lowest non-recent of head 0
    pol = make_policy("h2o", budget=20)  # 10 heavy + 10 recent
    keep = pol.on_prefill(lockstep_obs(2, 40, acc_attn=acc))
    assert 5 in keep[0].tolist() and 17 in keep[1].tolist()
    assert set(range(30, 40)) <= set(keep[0].tolist())
    assert len(keep[0]) == 20

    # Decode: one over budget, exactly the lowest non-recent token leaves.
    acc21 = torch.arange(21, dtype=torch.float32).repeat(1, 1) + 1
    acc21[0, 3] = 0.1
    acc21[0, 20] = 0.0  # newest token, recent
    obs = LayerObs(0, 1, 1, torch.arange(21)[None], seq_len=21, prompt_len=21, acc_attn=acc21)
    keep = pol.on_decode(obs)
    assert sorted(set(range(21)) - set(keep[0].tolist())) == [3]


def _slow_snap(obs_attn, n_kv, kernel):
    n_heads, _, length = obs_attn.shape
    votes = obs_attn.sum(1)
    pooled = torch.empty_like(votes)
    r = kernel // 2
    for h in range(n_heads):
        for i in range(length):
            pooled[h, i] = votes[h, max(0, i - r) : i + r + 1].max()
    g = n_heads // n_kv
    return torch.stack([pooled[k * g : (k + 1) * g].mean(0) for k in range(n_kv)])


@settings(max_examples=25, deadline=None)
@given(
    n_kv=st.integers(1, 3),
    group=st.integers(1, 4),
    w=st.integers(1, 8),
    length=st.integers(1, 60),
    kernel=st.sampled_from([1, 3, 5, 7]),
    seed=st.integers(0, 1000),
)
def test_snapkv_pooling_and_gqa_match_slow_reference(n_kv, group, w, length, kernel, seed):
    torch.manual_seed(seed)
    attn = torch.softmax(torch.randn(n_kv * group, w, length), -1)
    torch.testing.assert_close(snap_scores(attn, n_kv, kernel), _slow_snap(attn, n_kv, kernel))


def test_snapkv_keeps_what_the_window_attends_to(lockstep_obs):
    length, w = 200, 32
    attn = torch.full((4, w, length), 1e-4)
    attn[0:2, :, 40] = 1.0  # KV head 0 (query heads 0,1) looks at 40
    attn[2:4, :, 120] = 1.0  # KV head 1 looks at 120
    attn = attn / attn.sum(-1, keepdim=True)
    pol = make_policy("snapkv", budget=w + 7, kernel=7)
    keep = pol.on_prefill(lockstep_obs(2, length, n_heads=4, obs_attn=attn))
    k0, k1 = set(keep[0].tolist()), set(keep[1].tolist())
    assert set(range(37, 44)) <= k0, "the pooled neighbourhood of the attended token is kept"
    assert set(range(117, 124)) <= k1
    assert set(range(length - w, length)) <= k0 & k1, "the observation window is kept"
    assert 120 not in k0 and 40 not in k1, "each KV head keeps its own tokens"


def test_snapkv_rerun_during_decode(lockstep_obs):
    pol = make_policy("snapkv", budget=40, rerun_every=8)
    attn = torch.softmax(torch.randn(2, 32, 47), -1)
    assert pol.on_decode(lockstep_obs(2, 47, obs_attn=attn, prompt_len=40)) is None
    attn = torch.softmax(torch.randn(2, 32, 48), -1)
    keep = pol.on_decode(lockstep_obs(2, 48, obs_attn=attn, prompt_len=40))
    assert [len(k) for k in keep] == [40, 40]
    assert make_policy("snapkv", budget=40).on_decode(lockstep_obs(2, 48)) is None


def test_pyramid_budgets_shrink_and_keep_the_total():
    b = pyramid_budgets(256, 30, 32, beta=20)
    assert sum(b) == 256 * 30
    assert all(x >= y for x, y in itertools.pairwise(b))
    assert b[0] > 256 > b[-1] >= 32


@settings(max_examples=50, deadline=None)
@given(avg=st.integers(32, 2000), n_layers=st.integers(1, 64), beta=st.floats(1.0, 40.0))
def test_pyramid_budgets_total_property(avg, n_layers, beta):
    b = pyramid_budgets(avg, n_layers, 32, beta)
    assert sum(b) == avg * n_layers and min(b) >= 32


def test_pyramidkv_uses_layer_budget(lockstep_obs):
    pol = make_policy("pyramidkv", budget=64)
    attn = torch.softmax(torch.randn(1, 32, 300), -1)
    sizes = [
        len(pol.on_prefill(lockstep_obs(1, 300, obs_attn=attn, layer=i, n_layers=4))[0])
        for i in range(4)
    ]
    assert sizes == pyramid_budgets(64, 4, 32) and sizes[0] > sizes[-1]


def test_tova_drops_the_lowest_attention_of_the_current_query():
    step = torch.full((4, 11), 0.1)
    step[:, 6] = 0.001  # every head ignores token 6
    obs = LayerObs(0, 1, 4, torch.arange(11).repeat(2, 1), 11, 10, step=1, step_attn=step)
    keep = make_policy("tova", budget=10).on_decode(obs)
    assert all(6 not in k.tolist() and len(k) == 10 for k in keep)
    # At prefill the last prompt token plays the current query.
    attn = torch.full((4, 1, 12), 0.1)
    attn[:, 0, 2] = 0.0
    obs = LayerObs(0, 1, 4, torch.arange(12).repeat(2, 1), 12, 12, obs_attn=attn)
    assert all(2 not in k.tolist() for k in make_policy("tova", budget=11).on_prefill(obs))


def test_longformer_and_bigbird_masks():
    lf = make_policy("longformer", local=3, n_global=2)
    m = lf.mask(8)
    assert m[7].tolist() == [True, True, False, False, False, True, True, True]
    assert not torch.any(torch.triu(m, 1)), "causal"
    bb = make_policy("bigbird", local=3, n_global=2, n_random=2, seed=1)
    mb = bb.mask(40)
    assert torch.all(mb | ~lf.mask(40)), "BigBird contains Longformer's pattern"
    extra = (mb & ~lf.mask(40)).sum(1)
    assert int(extra[39]) == 2 and int(extra[3]) == 0
    assert not torch.any(torch.triu(mb, 1))
    assert torch.equal(mb, make_policy("bigbird", local=3, n_global=2, n_random=2, seed=1).mask(40))


def test_bigbird_decode_keeps_a_stable_random_set(lockstep_obs):
    bb = make_policy("bigbird", local=8, n_global=2, n_random=4, seed=3)
    k1 = bb.on_prefill(lockstep_obs(1, 100))[0].tolist()
    mid = [p for p in k1 if 2 <= p < 92]
    assert len(k1) == 14 and len(mid) == 4
    # The random picks that survive into the next step are the same tokens.
    pos = torch.tensor([[*k1, 100]])
    obs = LayerObs(0, 1, 1, pos, seq_len=101, prompt_len=100)
    k2 = bb.on_decode(obs)[0].tolist()
    assert set(k2) - set(range(93, 101)) - {0, 1} <= set(mid)


def test_pooling_functional_max_equals_unfold():
    x = torch.rand(3, 20)
    ref = F.pad(x, (3, 3), value=float("-inf")).unfold(1, 7, 1).amax(-1)
    torch.testing.assert_close(snap_scores(x[:, None, :], 3, 7), ref)
