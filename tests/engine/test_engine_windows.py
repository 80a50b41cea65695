"""Sliding-window layers in the paged engine against a no-cache windowed oracle (toy model).

Layer 0 sees only the last 5 keys, layer 1 everything (a local/global mix, as in Gemma or
Mistral). The oracle recomputes every token with explicit masks; the engine must agree when
prompts are batched, split into chunks, and partly served from the prefix cache.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from engine_toy_model import CFG, ToyModel, one_torch_thread  # noqa: F401  (fixture)

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.errors import CtxlabError

WINDOWS = (5, None)
WCFG = SimpleNamespace(**{**vars(CFG), "sliding_windows": WINDOWS})
MODEL = ToyModel(seed=1)
N_OUT = 10


class WindowedDense:
    """Causal attention over the whole sequence, keys at most `window - 1` behind."""

    def attend(self, layer_idx, q, k, v):
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        pos = torch.arange(q.shape[0])
        diff = pos.view(-1, 1) - pos.view(1, -1)
        mask = diff >= 0
        if WINDOWS[layer_idx] is not None:
            mask &= diff < WINDOWS[layer_idx]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
        )
        return o.transpose(0, 1)


@torch.inference_mode()
def oracle(prompt: list[int], n: int, backend=None) -> list[int]:
    ids, out = list(prompt), []
    for _ in range(n):
        h = MODEL.forward(torch.tensor(ids), torch.arange(len(ids)), backend or WindowedDense())
        out.append(int(MODEL.compute_logits(h[-1:]).argmax(-1)))
        ids.append(out[-1])
    return out


rng = random.Random(3)
PROMPTS = [[rng.randrange(CFG.vocab_size) for _ in range(rng.randint(4, 40))] for _ in range(5)]
EXPECTED = [oracle(p, N_OUT) for p in PROMPTS]


def engine(**kw) -> LLMEngine:
    args = dict(kv_pool_tokens=2048, block_size=4, max_num_batched_tokens=512, max_num_seqs=8)
    args.update(kw)
    return LLMEngine(MODEL, WCFG, **args)


def run(eng: LLMEngine, ps) -> list[list[int]]:
    rids = [eng.add_request(p, SamplingParams(max_tokens=N_OUT)) for p in ps]
    return [o.token_ids for o in eng.run_all(rids)]


def test_the_window_changes_the_answer():
    """Otherwise the tests below could not tell a windowed engine from a full one."""
    from engine_toy_model import DenseCausal

    assert any(oracle(p, N_OUT, DenseCausal()) != e for p, e in zip(PROMPTS, EXPECTED, strict=True))


@pytest.mark.parametrize("budget", [512, 6, 1])
def test_windowed_layers_match_the_oracle_batched_and_chunked(budget):
    assert run(engine(max_num_batched_tokens=budget), PROMPTS) == EXPECTED


def test_windowed_layers_with_a_prefix_hit():
    eng = engine()
    base = PROMPTS[4]
    run(eng, [base])
    other = [*base, 7, 8, 9]
    assert run(eng, [other]) == [oracle(other, N_OUT)]
    assert eng.stats().prefix_cache_hits > 0


def test_a_policy_refused_on_a_windowed_model_is_one_sentence():
    """SnapKV runs (on the global layer: tests/policy/test_windowed_policies.py); Quest's
    page reads are not implemented for sliding layers."""
    with pytest.raises(CtxlabError, match="cannot run on a model with sliding-window layers"):
        engine(policy="quest", budget=64)
