"""Small random models of each supported family: transformers writes them, ctxlab reads them
from the safetensors folder, and both must give the same logits. Covers untied embeddings,
GQA, qkv bias (Qwen2), q/k-norm (Qwen3), sliding windows (Mistral), RoPE scaling, and Gemma 3's
block (its config.json read by the architecture registry's hook)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ctxlab.model import DenseBackend, greedy_generate, load_model  # noqa: E402

COMMON = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    initializer_range=0.2,
    tie_word_embeddings=False,
)

CASES = {
    "llama": ("LlamaConfig", {}),
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True}),
    "llama-linear": ("LlamaConfig", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}),
    "llama-dynamic": ("LlamaConfig", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}),
    "llama-yarn": (
        "LlamaConfig",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 8,
            }
        },
    ),
    "llama-llama3": (
        "LlamaConfig",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    "mistral-sliding": ("MistralConfig", {"sliding_window": 8, "head_dim": 16}),
    "qwen2-bias": ("Qwen2Config", {}),
    "qwen3-qknorm": ("Qwen3Config", {"head_dim": 24}),
    # local/global layers with their own RoPE bases, a query scale that is not head_dim's
    "gemma3-local-global": (
        "Gemma3TextConfig",
        {
            "head_dim": 16,
            "sliding_window": 12,
            "query_pre_attn_scalar": 24,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "tie_word_embeddings": True,
        },
    ),
}


def make_hf(name: str):
    import transformers

    cls_name, extra = CASES[name]
    cfg_cls = getattr(transformers, cls_name)
    kwargs = {**COMMON, **extra}
    if "rope_parameters" in kwargs:
        kwargs["rope_parameters"] = {**kwargs["rope_parameters"], "rope_theta": 10000.0}
    cfg = cfg_cls(**kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.config._attn_implementation = "eager"
    return model.eval()


def logits(model, ids):
    backend = DenseBackend.for_model(model)
    backend.set_batch([0], [0, len(ids)])
    return model.compute_logits(model.forward(torch.tensor(ids), torch.arange(len(ids)), backend))


@pytest.mark.parametrize("name", sorted(CASES))
def test_tiny_model_matches_transformers(name, tmp_path):
    hf = make_hf(name)
    hf.save_pretrained(tmp_path)
    mine = load_model(str(tmp_path))
    torch.manual_seed(1)
    ids = torch.randint(0, COMMON["vocab_size"], (40,)).tolist()  # 40 > max_position: dynamic
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    got = logits(mine.model, ids)
    assert (got - ref).abs().max().item() <= 1e-4
    with torch.no_grad():
        hf_gen = hf.generate(
            torch.tensor([ids[:10]]), max_new_tokens=12, do_sample=False, eos_token_id=None
        )
    assert greedy_generate(mine.model, ids[:10], 12) == hf_gen[0, 10:].tolist()


def test_sliding_window_is_applied(tmp_path):
    """The Mistral case above would also pass if windows were ignored only if W >= length."""
    hf = make_hf("mistral-sliding")
    hf.save_pretrained(tmp_path)
    mine = load_model(str(tmp_path))
    assert mine.config.sliding_windows == (8, 8, 8)
    ids = list(range(1, 41))
    windowed = logits(mine.model, ids)
    full = DenseBackend(mine.config.num_layers)  # no windows
    full.set_batch([0], [0, len(ids)])
    unwindowed = mine.model.compute_logits(
        mine.model.forward(torch.tensor(ids), torch.arange(len(ids)), full)
    )
    torch.testing.assert_close(windowed[:8], unwindowed[:8])
    assert (windowed[8:] - unwindowed[8:]).abs().max().item() > 1e-3


def test_qwen3_config_reads_qk_norm_and_head_dim(tmp_path):
    make_hf("qwen3-qknorm").save_pretrained(tmp_path)
    cfg = load_model(str(tmp_path)).config
    assert cfg.qk_norm and cfg.head_dim == 24 and cfg.arch == "qwen3"
    assert cfg.sliding_windows == (None, None, None)
