"""A fixture that builds a `LayerObs` from synthetic tensors."""

from __future__ import annotations

import pytest
import torch

from ctxlab.policy.observation import LayerObs


def _lockstep_obs(n_kv: int, length: int, n_heads: int | None = None, **kw) -> LayerObs:
    """A layer whose lanes all hold positions 0..length-1 (no eviction yet)."""
    pos = torch.arange(length).repeat(n_kv, 1)
    return LayerObs(
        layer=kw.pop("layer", 0),
        n_layers=kw.pop("n_layers", 1),
        n_heads=n_heads or n_kv,
        positions=pos,
        seq_len=kw.pop("seq_len", length),
        prompt_len=kw.pop("prompt_len", length),
        **kw,
    )


@pytest.fixture
def lockstep_obs():
    return _lockstep_obs
