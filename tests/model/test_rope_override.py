"""`--rope-scaling` on a checkpoint that does not scale RoPE: parsing, the frequencies rope.py
gives, and what a scaled model computes (tiny random models, no file)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ctxlab.arch.rope_scaling import RopeOverride  # noqa: E402
from ctxlab.errors import CtxlabError  # noqa: E402
from ctxlab.model import DenseBackend, LlamaModel, LoadedModel, ModelConfig  # noqa: E402
from ctxlab.model.rope import compute_inv_freq  # noqa: E402
from ctxlab.model.rope_override import apply_rope_override  # noqa: E402

TRAINED = 64
CFG = ModelConfig(
    arch="llama", vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, max_position=TRAINED,
)  # fmt: skip


def _tiny(seed: int = 0, cfg: ModelConfig = CFG) -> LoadedModel:
    torch.manual_seed(seed)
    net = LlamaModel(cfg)
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return LoadedModel(model=net, config=cfg, source_path=Path("tiny"))


@pytest.mark.parametrize(
    "text", ["foo", "linear", "linear:", "linear:0.5", "yarn:abc", "dynamic:100", "ntk:2"]
)
def test_bad_values_are_one_sentence(text):
    with pytest.raises(CtxlabError) as err:
        RopeOverride.parse(text)
    message = str(err.value)
    assert "--rope-scaling" in message and "\n" not in message


def test_none_leaves_the_model_as_its_checkpoint_says():
    loaded = _tiny()
    rope = loaded.model.rope
    assert RopeOverride.parse("none") is None and RopeOverride.parse(None) is None
    assert apply_rope_override(loaded, "none") is loaded
    assert loaded.model.rope is rope and loaded.config == CFG and loaded.rope_override is None
    default, _ = compute_inv_freq(CFG.head_dim, CFG.rope_theta, None, TRAINED)
    assert torch.equal(rope.inv_freq, default)


@pytest.mark.parametrize("spec", ["linear:4", "dynamic:2", "yarn:4"])
def test_frequencies_are_rope_pys(spec):
    loaded = apply_rope_override(_tiny(), spec)
    kind, factor = spec.split(":")
    scaling = {
        "rope_type": kind,
        "factor": float(factor),
        "original_max_position_embeddings": TRAINED,
    }
    assert loaded.config.rope_scaling == scaling
    assert loaded.config.max_position == int(TRAINED * float(factor))
    pos = torch.tensor([0, 5, TRAINED - 1, 3 * TRAINED])  # the last is past the trained length
    want_inv, want_scale = compute_inv_freq(
        CFG.head_dim, CFG.rope_theta, scaling, TRAINED, seq_len=3 * TRAINED + 1
    )
    angles = pos.float()[:, None] * want_inv[None, :]
    cos, _ = loaded.model.rope.cos_sin(pos, torch.float32)
    assert torch.allclose(cos, torch.cat((angles, angles), -1).cos() * want_scale, atol=1e-6)
    base, _ = compute_inv_freq(CFG.head_dim, CFG.rope_theta, None, TRAINED)
    assert not torch.allclose(want_inv, base)  # it really changed the rotation


def test_linear_scaling_runs_position_p_as_p_over_f():
    """Position interpolation: the scaled model at positions 4k computes what the plain model
    computes at positions k (RoPE is the only place positions enter)."""
    ids = torch.tensor([3, 14, 15, 9, 26, 5])
    plain, scaled = _tiny(1), apply_rope_override(_tiny(1), "linear:4")

    def hidden(loaded: LoadedModel, positions: torch.Tensor) -> torch.Tensor:
        backend = DenseBackend.for_model(loaded.model)
        backend.set_batch([0], [0, len(ids)])
        return loaded.model.forward(ids, positions, backend)

    k = torch.arange(len(ids)) * 7
    assert torch.allclose(hidden(scaled, 4 * k), hidden(plain, k), atol=1e-5)
    assert not torch.allclose(hidden(scaled, k), hidden(plain, k), atol=1e-3)


def test_a_checkpoint_that_already_scales_is_refused():
    cfg = ModelConfig(**{**CFG.__dict__, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    with pytest.raises(CtxlabError, match="already scales RoPE"):
        apply_rope_override(_tiny(cfg=cfg), "yarn:2")
    loaded = apply_rope_override(_tiny(), "yarn:2")
    assert apply_rope_override(loaded, "yarn:2") is loaded  # handed on: applied once
    with pytest.raises(CtxlabError, match="was already given --rope-scaling yarn:2"):
        apply_rope_override(loaded, "linear:2")  # ctxlab's own scaling, not the checkpoint's
