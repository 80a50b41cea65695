from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.errors import CtxlabError
from ctxlab.policy import make_policy
from ctxlab.policy.observation import PageObs
from ctxlab.policy.quest import page_bound, page_summaries


@settings(max_examples=60, deadline=None)
@given(
    n_kv=st.integers(1, 3),
    group=st.integers(1, 3),
    length=st.integers(1, 90),
    page=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 10_000),
)
def test_bound_is_an_upper_bound_for_every_block(n_kv, group, length, page, seed):
    torch.manual_seed(seed)
    keys = torch.randn(n_kv, length, 8) * 3
    lens = torch.randint(1, length + 1, (n_kv,))
    q = torch.randn(n_kv * group, 8)
    kmin, kmax = page_summaries(keys, lens, page)
    bound = page_bound(q, kmin, kmax)  # [H, P]
    for h in range(n_kv * group):
        kv = h // group
        for p in range(kmin.shape[1]):
            lo, hi = p * page, min((p + 1) * page, int(lens[kv]))
            if lo >= hi:
                assert bound[h, p] == float("-inf")
                continue
            true = (keys[kv, lo:hi] @ q[h]).max()
            assert bound[h, p] >= true - 1e-4


def choose(q, kmin, kmax, lens, page, n_pages):
    """Quest's decision for one sequence (batch of 1): sorted pages per KV head."""
    pol = make_policy("quest", budget=n_pages * page)
    n_kv = kmin.shape[0]
    have = (lens + page - 1) // page
    obs = PageObs(
        q.float().view(1, n_kv, -1, q.shape[-1]),
        kmin[None],
        kmax[None],
        have[None],
        torch.tensor([pol.pages_per_step(0, page)]),
    )
    choice = pol.choose_pages(obs)
    top, ok = choice.pages, choice.ok
    return [top[0, h][ok[0, h]].tolist() for h in range(n_kv)]


def test_selection_takes_sinks_current_and_the_planted_page():
    torch.manual_seed(0)
    keys = torch.randn(2, 160, 16) * 0.1
    q = torch.zeros(4, 16)
    q[:, 0] = 1.0
    keys[0, 70, 0] = 10.0  # page 4 of KV head 0 matches the query
    keys[1, 130, 0] = 10.0  # page 8 of KV head 1
    lens = torch.tensor([160, 150])
    kmin, kmax = page_summaries(keys, lens, 16)
    assert choose(q, kmin, kmax, lens, 16, n_pages=3) == [[0, 4, 9], [0, 8, 9]]


@settings(max_examples=40, deadline=None)
@given(
    n_kv=st.integers(1, 3),
    group=st.integers(1, 3),
    lens=st.lists(st.integers(1, 70), min_size=3, max_size=3),
    n_pages=st.integers(2, 6),
    seed=st.integers(0, 10_000),
)
def test_choice_is_sinks_current_and_the_best_bounds(n_kv, group, lens, n_pages, seed):
    """Against the definition, lane by lane: the sink page, the current page, then the
    highest bounds (the best head of the group), all of them when the lane is short."""
    torch.manual_seed(seed)
    page = 4
    lens_t = torch.tensor(lens[:n_kv])
    keys = torch.randn(n_kv, 70, 8)
    q = torch.randn(n_kv * group, 8)
    kmin, kmax = page_summaries(keys, lens_t, page)
    got = choose(q, kmin, kmax, lens_t, page, n_pages)
    bound = page_bound(q, kmin, kmax).view(n_kv, group, -1).amax(1)
    for h in range(n_kv):
        have = -(-int(lens_t[h]) // page)
        if have <= n_pages:
            assert got[h] == list(range(have))
            continue
        rest = bound[h, 1 : have - 1]
        best = torch.topk(rest, n_pages - 2).indices + 1
        assert got[h] == sorted([0, have - 1, *best.tolist()])


def test_quest_budget_must_hold_sinks_and_current_page():
    assert make_policy("quest", budget=512).pages_per_step(0, 16) == 32
    with pytest.raises(CtxlabError, match="too small"):
        make_policy("quest", budget=16).check_page(16)
    make_policy("quest", budget=16).check_page(4)
    # A ratio is a share of each prompt, never below the sink page plus the current one.
    half = make_policy("quest", budget=0.5)
    assert half.pages_per_step(1024, 16) == 32 and half.pages_per_step(20, 16) == 2
