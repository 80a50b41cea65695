"""A pure decode step's attention run from the model's compiled decode block
(`engine/compiled_decode.py`) against the engine's Python attention path.

Both write the same rows into the pool and run the same C decode loop on the same arguments,
so every sampled token and every byte of the pool must match, for each weight format that
has the block, float32 and bf16 caches, sequences of different lengths (masked reads) and a
shared prefix (its blocks folded once). A wrong row, table, mask or length is caught by the
pool's bytes even where the tokens happen to agree. Marked `isa` (the AVX2 rerun: bf16 takes
the loop there and int8 its fbgemm kernel, without the block).
"""

from __future__ import annotations

import pytest
import torch

from ctxlab.engine import LLM, SamplingParams
from ctxlab.model import decode_block, gemv, load_model

pytestmark = [pytest.mark.isa, pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]

PROMPTS = [
    list(range(2000, 2090)),  # lengths differ: masked reads
    list(range(2000, 2064)) + list(range(500, 530)),  # a 64-token prefix shared with the first
    list(range(3000, 3037)),
    [*range(2000, 2064), 7, 8, 9],
]


def run(model, kv: str, compiled: bool, policy: str | None = None):
    """Tokens of every request and the pool's bytes after they finish; how many layer
    calls took the compiled attention."""
    budget = None if policy is None else 48
    engine = LLM(model, kv_cache_dtype=kv, kv_pool_tokens=2048, policy=policy, budget=budget)
    engine = engine.engine
    backend = engine.runner.backend
    if not compiled:
        backend._compiled = None
    taken = 0
    described = backend.compiled_decode

    def counting(layer_idx: int) -> int:
        nonlocal taken
        at = described(layer_idx)
        taken += at != 0
        return at

    backend.compiled_decode = counting
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    outs = engine.run_all([engine.add_request(p, params) for p in PROMPTS])
    return [o.token_ids for o in outs], backend.pool.data.clone(), taken


CASES = [("fp32", "auto"), ("bf16", "bfloat16"), ("int8", "auto")]


@pytest.mark.parametrize(("weights", "kv"), CASES)
def test_compiled_attention_is_the_python_path_bit_for_bit(weights, kv, gguf_path):
    if decode_block.kernel() is None:
        pytest.skip("the compiled decode block is not built here")
    if weights == "int8" and not gemv.amx_int8():
        pytest.skip("int8 has the block on AMX tiles only")
    model = load_model(str(gguf_path), weights=weights)
    tokens, pool, taken = run(model, kv, compiled=True)
    want_tokens, want_pool, none = run(model, kv, compiled=False)
    assert none == 0 and taken > 0
    assert tokens == want_tokens
    assert torch.equal(pool, want_pool)


@pytest.mark.parametrize("policy", ["streaming", "h2o", "quest"])
def test_policies_keep_their_answers_and_the_block_only_plain_reads(policy, loaded):
    """A window-shaped read (StreamingLLM's sink and window: a mask) goes compiled; H2O's
    scores and Quest's page reads are not what the block runs and keep the Python path.
    Either way the answer is the Python path's."""
    if decode_block.kernel() is None:
        pytest.skip("the compiled decode block is not built here")
    tokens, pool, taken = run(loaded, "auto", compiled=True, policy=policy)
    want_tokens, want_pool, _ = run(loaded, "auto", compiled=False, policy=policy)
    assert tokens == want_tokens and torch.equal(pool, want_pool)
    assert (taken > 0) == (policy == "streaming")


def test_a_quantized_cache_keeps_the_python_path_and_says_why(loaded, monkeypatch, caplog):
    """An int8 cache quantizes rows as it writes them, which the block's row write does not:
    its decode steps keep `attend`, and the engine says so once."""
    from ctxlab.engine import compiled_decode

    monkeypatch.setattr(compiled_decode, "_said", set())
    with caplog.at_level("INFO", logger="ctxlab.engine.kernels"):
        engine = LLM(loaded, kv_pool_tokens=1024, kv_format="int8").engine
    assert engine.runner.backend._compiled is None
    assert "quantizes or transforms its rows" in caplog.text
    out = engine.run_all([engine.add_request([5, 6, 7, 8], SamplingParams(max_tokens=4))])
    assert len(out[0].token_ids) == 4
