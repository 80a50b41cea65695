"""KeyDiff's own rule (the generic tests check what every policy must do)."""

from __future__ import annotations

import torch

from ctxlab.policy import make_policy


def test_keeps_the_keys_that_point_away_from_the_others(lockstep_obs):
    torch.manual_seed(0)
    keys = torch.randn(2, 12, 8) * 0.1
    keys[:, :, 0] += 1.0  # most keys point along channel 0
    keys[0, 4] = torch.tensor([-1.0, 0, 0, 0, 0, 0, 0, 0])  # head 0: slot 4 points away
    keys[1, 9] = torch.tensor([0, 1.0, 0, 0, 0, 0, 0, 0])  # head 1: slot 9 is orthogonal
    kept = make_policy("keydiff", 3).on_prefill(lockstep_obs(2, 12, keys=keys))
    assert kept is not None
    assert 4 in kept[0].tolist() and 9 in kept[1].tolist()
    assert [len(k) for k in kept] == [3, 3]


def test_the_norm_of_a_key_does_not_matter(lockstep_obs):
    """Scores are cosine similarities: scaling a key changes nothing (unlike KNorm)."""
    torch.manual_seed(1)
    keys = torch.randn(1, 20, 8)
    pol = make_policy("keydiff", 6)
    base = pol.on_prefill(lockstep_obs(1, 20, keys=keys))
    scaled = keys * torch.rand(1, 20, 1) * 10
    assert [k.tolist() for k in pol.on_prefill(lockstep_obs(1, 20, keys=scaled))] == [
        k.tolist() for k in base
    ]
