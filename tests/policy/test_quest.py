from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.errors import CtxlabError
from ctxlab.policy import make_policy
from ctxlab.policy.quest import page_bound, page_summaries, read_fraction, select_pages


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


def test_selection_takes_sinks_current_and_the_planted_page():
    torch.manual_seed(0)
    keys = torch.randn(2, 160, 16) * 0.1
    q = torch.zeros(4, 16)
    q[:, 0] = 1.0
    keys[0, 70, 0] = 10.0  # page 4 of KV head 0 matches the query
    keys[1, 130, 0] = 10.0  # page 8 of KV head 1
    lens = torch.tensor([160, 150])
    kmin, kmax = page_summaries(keys, lens, 16)
    pages = select_pages(q, kmin, kmax, lens, 16, n_pages=3)
    assert pages[0].tolist() == [0, 4, 9]
    assert pages[1].tolist() == [0, 8, 9]
    frac = read_fraction(pages, lens, 16)
    assert frac == pytest.approx(6 / 20)


def test_short_lanes_read_everything():
    keys = torch.randn(1, 20, 4)
    lens = torch.tensor([20])
    kmin, kmax = page_summaries(keys, lens, 16)
    assert select_pages(torch.randn(1, 4), kmin, kmax, lens, 16, 4)[0].tolist() == [0, 1]


def test_quest_budget_must_hold_sinks_and_current_page():
    assert make_policy("quest", budget=512).pages_per_step() == 32
    with pytest.raises(CtxlabError, match="too small"):
        make_policy("quest", budget=16)
    # A ratio is a share of each prompt, never below the sink page plus the current one.
    half = make_policy("quest", budget=0.5)
    assert half.pages_per_step(1024) == 32 and half.pages_per_step(20) == 2
