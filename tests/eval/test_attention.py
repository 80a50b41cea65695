"""Where attention goes: the statistics on hand-made distributions, then sinks on SmolLM2."""

import pytest
import torch

from ctxlab.eval.attention import group_probs, mass_statistics, measure_prompt, query_positions
from ctxlab.eval.attention_report import summarize
from ctxlab.eval.perplexity import text_ids
from ctxlab.model.dense import _causal_attention


def _uniform(query_pos: torch.Tensor, length: int, window: int | None) -> torch.Tensor:
    keys = torch.arange(length)[None, :]
    seen = keys <= query_pos[:, None]
    if window is not None:
        seen &= keys > query_pos[:, None] - window
    return seen.double() / seen.sum(-1, keepdim=True)


def test_uniform_attention_gives_the_uniform_shares():
    pos = torch.tensor([99, 199])
    stats = mass_statistics(_uniform(pos, 200, None), pos, None, sinks=4)
    assert stats["first"].tolist() == pytest.approx([1 / 100, 1 / 200])
    assert stats["sinks"].tolist() == pytest.approx([4 / 100, 4 / 200])
    assert stats["oldest"].tolist() == pytest.approx([4 / 100, 4 / 200])
    # ceil(1 % of n) and ceil(20 % of n) keys of equal weight
    assert stats["top1"].tolist() == pytest.approx([1 / 100, 2 / 200])
    assert stats["top20"].tolist() == pytest.approx([20 / 100, 40 / 200])


def test_a_sliding_window_sees_no_sink_but_has_an_edge():
    pos = torch.tensor([150])
    stats = mass_statistics(_uniform(pos, 151, 50), pos, 50, sinks=3)
    assert stats["first"].item() == 0 and stats["sinks"].item() == 0
    assert stats["oldest"].item() == pytest.approx(3 / 50)
    assert stats["top20"].item() == pytest.approx(10 / 50)


def test_concentrated_mass_is_found_by_every_statistic():
    # 2 KV heads x 1 query at position 9: one head puts 0.9 on token 0, the other 0.6 on token 7
    probs = torch.full((2, 1, 10), 0.0)
    probs[0, 0, 0], probs[0, 0, 1:] = 0.9, 0.1 / 9
    probs[1, 0, 7], probs[1, 0, [0, 1, 2, 3]] = 0.6, 0.1
    stats = mass_statistics(probs, torch.tensor([9]), None, sinks=2)
    assert stats["first"][:, 0].tolist() == pytest.approx([0.9, 0.1])
    assert stats["sinks"][:, 0].tolist() == pytest.approx([0.9 + 0.1 / 9, 0.2])
    assert stats["top1"][:, 0].tolist() == pytest.approx([0.9, 0.6])  # ceil(0.1) = 1 key
    assert stats["top20"][:, 0].tolist() == pytest.approx([0.9 + 0.1 / 9, 0.7])  # 2 keys


@pytest.mark.parametrize("window", [None, 5])
def test_recomputed_probabilities_reproduce_the_attention_output(window):
    torch.manual_seed(0)
    length, heads, d = 12, 3, 8
    q, k, v = (torch.randn(length, heads, d) for _ in range(3))
    pos = torch.tensor([3, 7, 11])
    probs = group_probs(q[pos], k, pos, window)  # one query head per KV head: no averaging
    assert torch.allclose(probs.sum(-1), torch.ones(heads, 3))
    out = torch.einsum("hql,lhd->qhd", probs, v)
    expected = _causal_attention(q, k, v, window)[pos]
    assert torch.allclose(out, expected, atol=1e-5)


def test_group_probs_average_the_query_heads_of_a_kv_head():
    torch.manual_seed(1)
    q, k = torch.randn(6, 4, 8), torch.randn(6, 2, 8)
    pos = torch.tensor([5])
    pair = group_probs(q[pos], k, pos, None)
    single = [group_probs(q[pos][:, [h]], k[:, [h // 2]], pos, None) for h in range(4)]
    assert torch.allclose(pair[0], (single[0][0] + single[1][0]) / 2, atol=1e-6)
    assert torch.allclose(pair[1], (single[2][0] + single[3][0]) / 2, atol=1e-6)


def test_query_positions_cover_the_second_half():
    pos = query_positions(100, 8)
    assert pos.min().item() == 50 and pos.max().item() == 99 and len(pos) == 8
    assert len(query_positions(10, 64)) == 5


@pytest.mark.model
def test_smollm2_first_token_is_an_attention_sink(loaded):
    """StreamingLLM's observation on the default model: averaged over its layers, the first
    token draws far more than its uniform share 1/n of the attention mass."""
    ids = text_ids(loaded.tokenizer, 192)
    measure = measure_prompt(loaded.model, ids, queries=8, sinks=4)
    doc = summarize([measure], loaded.config.sliding_windows, 4)
    first = doc["by_kind"]["global"]["first"]["value"]
    uniform = doc["uniform"]["first"]  # about 1/150 here
    assert first > 20 * uniform, (first, uniform)
    # and the heaviest 20 % of keys hold well over 20 % of the mass
    assert doc["by_kind"]["global"]["top20"]["value"] > 0.5
