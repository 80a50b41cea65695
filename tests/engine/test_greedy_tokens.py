"""Greedy sampling's argmax (`sampling.greedy_tokens`, numpy's on the CPU) against torch's.

The rule the engine's greedy outputs depend on: the first index of the largest logit on a
tie, a NaN counted as the largest, a row of -inf giving index 0; any batch size; a view
that is not contiguous.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.engine.sampling import SamplingParams, greedy_tokens, sample


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 6),
    vocab=st.integers(1, 300),
    levels=st.integers(1, 5),
    nan=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_greedy_tokens_are_torch_s_argmax(rows, vocab, levels, nan, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, levels, (rows, vocab), generator=g).float()  # many ties
    if nan:
        logits.view(-1)[torch.randint(0, rows * vocab, (2,), generator=g)] = float("nan")
    logits[0] = float("-inf")
    assert greedy_tokens(logits) == logits.argmax(dim=-1).tolist()
    wide = torch.cat((logits, logits), dim=1)[:, ::2]  # a strided view
    assert greedy_tokens(wide) == wide.argmax(dim=-1).tolist()


def test_sample_is_greedy_at_temperature_zero():
    logits = torch.tensor([[0.5, 2.0, 2.0], [3.0, -1.0, 3.0]], dtype=torch.bfloat16)
    assert sample(logits, [SamplingParams(temperature=0.0)] * 2, [None, None]) == [1, 0]
