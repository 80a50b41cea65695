"""RoPE scaling kinds against transformers' ROPE_INIT_FUNCTIONS, and key re-positioning."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ctxlab.errors import CtxlabError  # noqa: E402
from ctxlab.model.rope import RotaryEmbedding, apply_rotary, compute_inv_freq  # noqa: E402

HEAD_DIM, THETA, MAX_POS = 64, 500000.0, 4096

KINDS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
}


def hf_inv_freq(scaling: dict, seq_len: int | None) -> tuple[torch.Tensor, float]:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(
        hidden_size=HEAD_DIM * 8,
        num_attention_heads=8,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POS,
        rope_parameters={**scaling, "rope_theta": THETA},
    )
    return ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg, "cpu", seq_len=seq_len)


@pytest.mark.parametrize("name", sorted(KINDS))
@pytest.mark.parametrize("seq_len", [None, 3 * MAX_POS])
def test_inv_freq_matches_transformers(name: str, seq_len: int | None):
    scaling = KINDS[name]
    ref, ref_scale = hf_inv_freq(scaling, seq_len)
    mine, scale = compute_inv_freq(HEAD_DIM, THETA, scaling, MAX_POS, seq_len)
    torch.testing.assert_close(mine, ref.float(), rtol=1e-6, atol=0)
    assert scale == pytest.approx(ref_scale, rel=1e-9)


def test_scaling_changes_frequencies():
    """Guard against a kind silently falling back to plain RoPE."""
    plain, _ = compute_inv_freq(HEAD_DIM, THETA, None, MAX_POS)
    for name, scaling in KINDS.items():
        mine, _ = compute_inv_freq(HEAD_DIM, THETA, scaling, MAX_POS, 3 * MAX_POS)
        assert not torch.allclose(mine, plain), name


def test_dynamic_grows_only_past_max_position():
    rope = RotaryEmbedding(HEAD_DIM, THETA, KINDS["dynamic"], MAX_POS)
    short_cos, _ = rope.cos_sin(torch.arange(10), torch.float32)
    plain_cos, _ = RotaryEmbedding(HEAD_DIM, THETA, None, MAX_POS).cos_sin(
        torch.arange(10), torch.float32
    )
    torch.testing.assert_close(short_cos, plain_cos)
    long_pos = torch.tensor([0, 5, 2 * MAX_POS])
    long_cos, _ = rope.cos_sin(long_pos, torch.float32)
    assert not torch.allclose(long_cos[1], plain_cos[5])


@pytest.mark.parametrize("name", ["default", "yarn", "llama3"])
def test_shift_keys_equals_rotating_at_the_new_position(name: str):
    scaling = None if name == "default" else KINDS[name]
    rope = RotaryEmbedding(HEAD_DIM, THETA, scaling, MAX_POS)
    torch.manual_seed(0)
    k = torch.randn(6, 3, HEAD_DIM)
    old = torch.tensor([5, 100, 2000, 7, 64, 3000])
    delta = torch.tensor([-5, -90, -1990, 3, 0, 1000])
    cos, sin = rope.cos_sin(old, torch.float32)
    rotated = apply_rotary(k, cos, sin)
    cos2, sin2 = rope.cos_sin(old + delta, torch.float32)
    expected = apply_rotary(k, cos2, sin2)
    torch.testing.assert_close(rope.shift_keys(rotated, delta), expected, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(rope.shift_keys(rotated, 0), rotated)


def test_unknown_kind_is_a_clear_error():
    with pytest.raises(CtxlabError, match="longrope"):
        RotaryEmbedding(HEAD_DIM, THETA, {"rope_type": "longrope", "factor": 2.0}, MAX_POS)
