"""`ctxlab.hf.cache` on transformers' Gemma 3 270M (the GGUF read by transformers itself).

transformers builds Gemma 3's own cache as a hybrid: its sliding layers keep the last
window - 1 tokens, its global layers every token. A `PolicyCache` drops what leaves a
sliding layer's window the same way (`HFRuntime._forget`), so with the full policy it
decodes the same tokens from the same bytes; a policy that evicts reports fewer.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import ctxlab.hf

pytestmark = pytest.mark.model

NEW = 16


@pytest.fixture(scope="module")
def prompt(gemma_loaded) -> torch.Tensor:
    text = " ".join(f"Crate {i} holds {i * 7} blue marbles." for i in range(70))
    ids = gemma_loaded.tokenizer.encode(text + " The capital of France is")
    assert len(ids) > 700  # past the 512-token window
    return torch.tensor([ids])


def _generate(model, ids: torch.Tensor, **kw) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW,
            do_sample=False,
            **kw,
        )
    return out[0, ids.shape[1] :].tolist()


def _bytes(cache) -> int:
    return sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )


@pytest.fixture(scope="module")
def own(gemma_hf_model, prompt):
    """transformers' greedy tokens and its own (hybrid) cache."""
    cache = DynamicCache(config=gemma_hf_model.config)
    return _generate(gemma_hf_model, prompt, cache=cache), cache


def test_full_policy_equals_transformers_own_cache(gemma_hf_model, prompt, own):
    tokens, hf_cache = own
    cache = ctxlab.hf.cache(gemma_hf_model, "full")
    assert _generate(gemma_hf_model, prompt, cache=cache) == tokens
    assert cache.resident_bytes() == _bytes(hf_cache)
    types = gemma_hf_model.config.layer_types
    window = gemma_hf_model.config.sliding_window
    seen = prompt.shape[1] + NEW - 1  # the last token's keys are never stored
    for i, kind in enumerate(types):
        held = len(cache.kept_positions(i)[0])
        assert held == (window - 1 if kind == "sliding_attention" else seen), (i, kind, held)


def test_an_evicting_policy_reports_fewer_resident_bytes(gemma_hf_model, prompt, own):
    _, hf_cache = own
    cache = ctxlab.hf.cache(gemma_hf_model, "snapkv", budget=128)
    got = _generate(gemma_hf_model, prompt, cache=cache)
    assert len(got) == NEW
    measured = sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )
    assert cache.resident_bytes() == measured
    assert 0 < cache.resident_bytes() < _bytes(hf_cache)
    for i in range(len(cache.layers)):
        kept = cache.kept_positions(i)[0]
        assert len(kept) <= 128 + 16  # the budget, plus at most one page of decode
