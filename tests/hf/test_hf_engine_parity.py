"""The same policy objects in ctxlab's engine and on transformers' SmolLM2 (same GGUF).

transformers 5.24 (the version in the project's environment) reads the GGUF itself
(`hf_model` fixture); ctxlab's engine reads it with its own loader. For one 120-token prompt:
- after the prompt, every registered policy that evicts keeps exactly the same original
  positions in every layer and KV head in both (the engine's block size 16 = `page`);
- with decode-time cuts and reads (H2O, TOVA, recall's far tier, the pages, tokens and mean
  rows of the read-time selectors: Quest, MoBA, DSA, NSA), 16 greedy
  tokens and the final kept positions are the same too.
"""

from __future__ import annotations

import dataclasses
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "policy"))
from golden_policies import kept_positions, ranges
from policy_cases import evicting

import ctxlab.hf
from ctxlab.engine import LLM, SamplingParams
from ctxlab.policy import make_policy

pytestmark = [pytest.mark.model, pytest.mark.isa, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def ids(loaded) -> list[int]:
    text = resources.files("ctxlab").joinpath("data/tinyshakespeare.txt").read_text()
    return loaded.tokenizer.encode(text[:3000])[:120]


def engine_run(loaded, policy, ids, n):
    """(tokens, kept positions per layer when the request finished) from the engine."""
    llm = LLM(loaded, kv_pool_tokens=1024, block_size=16, policy=policy)
    eng, got = llm.engine, {}
    finish = eng.scheduler.finish

    def record(seq, reason, *rest):
        got["kept"] = kept_positions(seq.kv, loaded.config.num_layers, loaded.config.num_kv_heads)
        finish(seq, reason, *rest)

    eng.scheduler.finish = record
    out = llm.generate([ids], SamplingParams(max_tokens=n, ignore_eos=True))[0]
    return out.token_ids, got["kept"]


def hf_kept(cache, n_layers: int) -> list[str]:
    out = []
    for layer in range(n_layers):
        lanes = [ranges(p) for p in cache.kept_positions(layer)]
        out.append(lanes[0] if len(set(lanes)) == 1 else "|".join(lanes))
    return out


# a prefill mask is refused by ctxlab.hf (test_hf_tiny_models.py checks the sentence)
@pytest.mark.parametrize("name", [n for n, p in evicting(48) if p.prefill_key(1) is None])
def test_prompt_end_cut_keeps_the_engines_positions(loaded, hf_model, ids, name):
    pol = dict(evicting(48))[name]
    pol = dataclasses.replace(pol, position_mode="original")
    _, want = engine_run(loaded, pol, ids, 1)
    cache = ctxlab.hf.cache(hf_model, pol, page=16)
    with torch.no_grad():
        hf_model(torch.tensor([ids]), cache=cache)
    assert hf_kept(cache, loaded.config.num_layers) == want
    assert cache.resident_bytes() < len(ids) * 30 * 3 * 64 * 2 * 4, "rows were dropped"


DECODING = {  # the policies that act while decoding (SnapKV/KNorm re-runs: tiny-model tests)
    "h2o": {"obs_window": 8},
    "tova": {},
    "recall": {"recall_blocks": 2, "block": 8},
    "quest": {},
    "moba": {},
    "dsa": {},
    "nsa": {"window": 16},
}


@pytest.mark.parametrize("name", list(DECODING))
def test_decoding_gives_the_engines_tokens_and_positions(loaded, hf_model, ids, name):
    pol = make_policy(name, 64 if name == "recall" else 48, **DECODING[name])
    want_tokens, want_kept = engine_run(loaded, pol, ids, 16)
    cache = ctxlab.hf.cache(hf_model, pol, page=16)
    out = hf_model.generate(torch.tensor([ids]), cache=cache, max_new_tokens=16, do_sample=False)
    assert out[0, len(ids) :].tolist() == want_tokens
    assert hf_kept(cache, loaded.config.num_layers) == want_kept
    if name == "recall":
        tier = cache.runtime.far.tier
        assert tier.bytes_out > 0 and tier.recalls > 0
    if name in ("quest", "moba", "dsa", "nsa"):
        assert 0 < cache.runtime.read_fraction < 1
