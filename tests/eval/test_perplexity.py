"""Streaming perplexity on the real model: prompt scoring is exact, and sinks matter."""

import math

import pytest
import torch

from ctxlab.engine.llm import LLM
from ctxlab.engine.sampling import SamplingParams
from ctxlab.eval.perplexity import segment_perplexity, streaming_perplexity, text_ids

pytestmark = pytest.mark.model


def test_segment_perplexity_is_exp_mean_nll():
    ends, ppl = segment_perplexity([math.log(0.5)] * 3 + [math.log(0.25)], 3)
    assert ends == [3, 4]
    assert ppl == pytest.approx([2.0, 4.0])


def test_chunked_prompt_scores_equal_one_dense_forward(loaded):
    from ctxlab.model import DenseBackend

    ids = text_ids(loaded.tokenizer, 200)
    llm = LLM(loaded, kv_pool_tokens=512, max_num_batched_tokens=48, enable_prefix_caching=False)
    (out,) = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=True))
    model = loaded.model
    backend = DenseBackend.for_model(model)
    backend.set_batch([0], [0, len(ids)])
    with torch.inference_mode():
        hidden = model.forward(torch.tensor(ids), torch.arange(len(ids)), backend)
        logp = model.compute_logits(hidden[:-1]).float().log_softmax(-1)
    expected = logp.gather(1, torch.tensor(ids[1:]).view(-1, 1)).view(-1)
    got = torch.tensor(out.prompt_logprobs)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-3)


def test_sinks_keep_perplexity_down_where_a_plain_window_breaks(loaded):
    ids = text_ids(loaded.tokenizer, 512)
    results = {r.label: r for r in streaming_perplexity(loaded, ids, 64, chunk=32)}
    full, window, streaming = results["full"], results["window"], results["streaming"]
    # What each run kept: full grows with the text, the others stay at the cache budget.
    per_token = 30 * 3 * 128 * 4
    assert full.resident_kv_bytes >= per_token * 511
    for r in (window, streaming):
        assert r.resident_kv_bytes <= per_token * (64 + 32 + 16)
    # Past the cache, dropping the first tokens without sinks costs far more than with them.
    assert streaming.overall_ppl < window.overall_ppl
    assert full.overall_ppl <= streaming.overall_ppl
