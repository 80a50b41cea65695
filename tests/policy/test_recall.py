from __future__ import annotations

import os

import pytest
import torch

from ctxlab.engine.far_tier import FarTier
from ctxlab.errors import CtxlabError
from ctxlab.policy import make_policy
from ctxlab.policy.observation import FarObs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_disk_tier_round_trips_blocks_bit_exactly(tmp_path, dtype):
    tier = FarTier("disk", str(tmp_path / "far.kv"))
    torch.manual_seed(0)
    blocks = []
    for lane in range(3):
        for b in range(2):
            pos = torch.arange(16) + 16 * b
            k, v = torch.randn(16, 64).to(dtype), torch.randn(16, 32).to(dtype)
            tier.put(lane, pos, k, v)
            blocks.append((lane, b, pos, k, v))
    assert os.path.getsize(tmp_path / "far.kv") == tier.bytes_out
    for lane, b, pos, k, v in reversed(blocks):
        p2, k2, v2 = tier.read(lane, b)
        assert torch.equal(p2, pos) and k2.dtype == dtype
        assert torch.equal(k2.view(torch.uint8), k.view(torch.uint8))
        assert torch.equal(v2.view(torch.uint8), v.view(torch.uint8))
    es = torch.tensor([], dtype=dtype).element_size()
    assert tier.bytes_in == tier.bytes_out == 6 * 16 * 96 * es
    assert tier.hits == 6
    tier.close()
    assert not os.path.exists(tmp_path / "far.kv")


def test_recall_picks_the_far_block_with_the_best_bound():
    tier = FarTier("memory")
    q = torch.zeros(3, 8)
    q[:, 2] = 1.0
    for b in range(5):
        k = torch.randn(16, 8) * 0.1
        if b == 3:
            k[7, 2] = 5.0  # the needle's key
        tier.put(0, torch.arange(16) + 16 * b, k, torch.randn(16, 8))
    one = make_policy("recall", 32, recall_blocks=1, block=16)
    two = make_policy("recall", 48, recall_blocks=2, block=16)
    assert one.choose_far(FarObs(q, *tier.summaries(0))) == [3]
    assert 3 in two.choose_far(FarObs(q, *tier.summaries(0)))
    assert two.choose_far(FarObs(q, *tier.summaries(1))) == []  # a lane with nothing far
    assert tier.bytes_out == 5 * 16 * 16 * 4


def test_recall_budget_errors():
    with pytest.raises(CtxlabError, match="too small for recall"):
        make_policy("recall", budget=64, recall_blocks=4, block=16)
    with pytest.raises(CtxlabError, match="far tier"):
        make_policy("recall", budget=256, tier="tape")
    with pytest.raises(CtxlabError, match="evicts"):
        make_policy("recall", base=make_policy("quest", 64))
    with pytest.raises(CtxlabError, match="share of the prompt"):
        make_policy("recall", budget=0.5)


def test_recall_wraps_a_policy_object():
    from ctxlab.policy import Budget
    from ctxlab.policy.h2o import H2OPolicy
    from ctxlab.policy.recall import RecallPolicy

    pol = RecallPolicy(base=H2OPolicy(budget=120), recall_blocks=2, block=4)
    pol.check()
    assert pol.evicts and "far" in pol.needs and "acc_attn" in pol.needs
    by_name = make_policy("recall", 128, recall_blocks=2, block=4)
    assert by_name.base.budget == Budget(tokens=120) and by_name.base.name == "h2o"
