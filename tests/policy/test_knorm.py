"""`knorm` keeps, per KV head, the keys with the lowest L2 norm (hand-built keys)."""

from __future__ import annotations

import torch

from ctxlab.policy import make_policy


def test_knorm_keeps_the_lowest_norm_keys_per_head(lockstep_obs):
    length, d = 40, 8
    keys = torch.full((2, length, d), 3.0)  # norm 3 * sqrt(8) everywhere ...
    low0, low1 = [2, 9, 17, 31], [0, 5, 26, 39]
    keys[0, low0] = 0.1  # ... except a few quiet keys, different ones per KV head
    keys[1, low1] = -0.1  # the sign does not matter, only the norm
    keys[0, 12] = 50.0  # the loudest key of head 0 goes first
    pol = make_policy("knorm", budget=4)
    keep = pol.on_prefill(lockstep_obs(2, length, keys=keys))
    assert keep[0].tolist() == low0 and keep[1].tolist() == low1

    # A ratio keeps that share of the prompt: 0.25 of 40 -> 10, the loudest key never.
    keep = make_policy("knorm", budget=0.25).on_prefill(lockstep_obs(2, length, keys=keys))
    assert [len(k) for k in keep] == [10, 10] and 12 not in keep[0].tolist()
    assert set(low0) <= set(keep[0].tolist()) and set(low1) <= set(keep[1].tolist())


def test_knorm_forces_no_sinks_or_window_and_decodes_only_on_request(lockstep_obs):
    keys = torch.ones(1, 30, 4)
    keys[0, :3] = 9.0  # first tokens (sinks elsewhere) are loud
    keys[0, -3:] = 9.0  # so are the most recent ones
    keep = make_policy("knorm", budget=10).on_prefill(lockstep_obs(1, 30, keys=keys))
    assert keep[0].tolist() == list(range(3, 13)), "ties keep the earlier slot"
    grown = lockstep_obs(1, 11, keys=torch.ones(1, 11, 4), prompt_len=10)
    assert make_policy("knorm", budget=10).on_decode(grown) is None
    assert len(make_policy("knorm", budget=10, rerun_every=1).on_decode(grown)[0]) == 10
