"""ctxlab.hf on tiny randomly initialised transformers models (transformers 5.24, float64).

Built here from transformers' own config classes, no download: a Qwen2-style GQA model, a
Mistral-style model whose every layer has a sliding window shorter than the prompt, and a
Gemma-3-style model mixing local (sliding) and global layers with its own query scaling.
For each:
- every registered policy but storage formats, with a budget that covers the whole text,
  gives exactly the greedy tokens of transformers' own cache: after the prompt every step
  runs ctxlab's decode attention over original positions (causal, sliding windows, the
  model's scaling), so this checks it against the model's attention;
- every one of them with a small budget really drops rows: the resident bytes measured
  from the cache tensors stay within its budget plus one page per lane, generation runs
  to its length, recall moves blocks through its far tier.
A sliding-window layer keeps only its window (window - 1 rows after each forward, as
transformers' own sliding layers do), whatever the policy: the rows no later query can see
are dropped, so "everything" below means everything a layer can still attend to.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "policy"))
from policy_cases import build

import ctxlab.hf
from ctxlab.errors import CtxlabError
from ctxlab.policy import LayerObs, make_policy, policy_names

PAGE, PROMPT, NEW = 4, 40, 10
COMMON = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**COMMON))


def mistral():
    from transformers import MistralConfig, MistralForCausalLM

    # 24: shorter than the prompt, longer than the small budget plus a page (rows to drop)
    return MistralForCausalLM(MistralConfig(**COMMON, sliding_window=24))


def gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    local, full = "sliding_attention", "full_attention"
    cfg = Gemma3TextConfig(
        **COMMON,
        head_dim=16,
        sliding_window=12,
        query_pre_attn_scalar=24,
        layer_types=[local, full, local],
    )
    return Gemma3ForCausalLM(cfg)


MODELS = {"qwen2-gqa": qwen2, "mistral-sliding": mistral, "gemma3-local-global": gemma3}
# storage formats and prefill masks are refused here (test_what_ctxlab_hf_refuses...)
NAMES = [
    n
    for n in policy_names()
    if (p := build(n, 16, small=True)).storage()[0] is None and p.prefill_key(1) is None
]


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    torch.manual_seed(0)
    m = MODELS[request.param]().double().eval()
    ids = torch.randint(0, 96, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    ref = m.generate(ids, max_new_tokens=NEW, do_sample=False)
    return m, ids, ref


def windows_of(m) -> list[int | None]:
    """Per layer: its sliding window, or None for a global layer."""
    cfg = m.config
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    return [window] * cfg.num_hidden_layers


def held_rows(window: int | None, seen: int) -> int:
    """Rows a layer holds after `seen` tokens with nothing evicted by a policy."""
    return seen if window is None else min(seen, window - 1)


def hf_policy(name: str, budget: int):
    """The registered policy, small windows, original positions (what transformers uses)."""
    return dataclasses.replace(build(name, budget, small=True), position_mode="original")


def generate(m, ids, cache):
    return m.generate(ids, cache=cache, max_new_tokens=NEW, do_sample=False)


@pytest.mark.parametrize("name", NAMES)
def test_a_budget_that_covers_everything_gives_the_models_own_tokens(model, name):
    m, ids, ref = model
    cache = ctxlab.hf.cache(m, hf_policy(name, 2048), page=PAGE)  # (PyramidKV: top layers too)
    assert torch.equal(generate(m, ids, cache), ref)
    seen = PROMPT + NEW - 1  # the last token's keys are never stored
    for layer, window in zip(cache.layers, windows_of(m), strict=True):
        if window is None or seen < window:
            assert layer.pruned is False
        else:  # exactly the last window - 1 positions of every lane
            want = torch.arange(seen - window + 1, seen)
            assert torch.equal(layer.positions, want.expand_as(layer.positions))


@pytest.mark.parametrize("name", NAMES)
def test_a_small_budget_drops_rows_for_real(model, name):
    m, ids, _ = model
    pol = hf_policy(name, 16)
    cache = ctxlab.hf.cache(m, pol, page=PAGE)
    out = generate(m, ids, cache)
    assert out.shape == (2, PROMPT + NEW)
    cfg = m.config
    d = cfg.head_dim if getattr(cfg, "head_dim", None) else cfg.hidden_size // 4
    seen = PROMPT + NEW - 1
    # B, n_kv, K+V, f64: every row a layer can still attend to
    full = sum(2 * 2 * held_rows(w, seen) * 2 * d * 8 for w in windows_of(m))
    got = cache.resident_bytes()
    assert got == sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )
    if not pol.evicts:
        assert got == full  # full keeps everything; Quest selects what a step reads
        assert ("pages" in pol.needs) == (cache.runtime.read_fraction < 1)
        return
    bound = 0
    for layer in range(cfg.num_hidden_layers):
        b = pol.lane_budget(LayerObs(layer, cfg.num_hidden_layers, 4, torch.empty(2, 0), 0, PROMPT))
        grows = NEW if not pol.wants_decode_hook(1) else PAGE
        bound += 2 * 2 * (b + grows) * 2 * d * 8
    assert got <= min(bound, full) and got < full
    if "far" in pol.needs:
        assert cache.runtime.far.tier.bytes_out > 0


def test_what_ctxlab_hf_refuses_is_one_sentence():
    m = qwen2()
    with pytest.raises(CtxlabError, match="original positions"):
        ctxlab.hf.cache(m, make_policy("streaming", 16))
    with pytest.raises(CtxlabError, match="storage formats"):
        ctxlab.hf.cache(m, "quant")
    with pytest.raises(CtxlabError, match="masks prefill"):
        ctxlab.hf.cache(m, make_policy("longformer-prefill", 256))
    with pytest.raises(CtxlabError, match=r"inside the Policy"):
        ctxlab.hf.cache(m, make_policy("h2o", 16), budget=8)
    with pytest.raises(CtxlabError, match="budgets are positive"):
        ctxlab.hf.cache(m, "h2o", -5)
