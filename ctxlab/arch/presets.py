"""Published architectures as the cache sees them, each with the source of its numbers.

Shapes come from each model's `config.json` on its Hugging Face repository (or its paper
where the config does not say); parameter counts are the published totals (exact where the
checkpoint's tensor count is public, otherwise the rounded figure from the model card).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ctxlab.arch.spec import (
    ArchSpec,
    LayerSpec,
    RecurrentState,
    interleaved_layers,
    uniform_layers,
)
from ctxlab.errors import CtxlabError


@dataclass(frozen=True)
class Preset:
    """A named architecture: how to build it, where its numbers come from, one-line summary."""

    name: str
    description: str
    source: str
    build: Callable[[Preset], ArchSpec]


def _gqa(kv_heads: int, head_dim: int) -> LayerSpec:
    return LayerSpec("full", kv_heads=kv_heads, d_k=head_dim, d_v=head_dim)


def _swa(kv_heads: int, head_dim: int, window: int) -> LayerSpec:
    return LayerSpec("sliding", kv_heads=kv_heads, d_k=head_dim, d_v=head_dim, window=window)


def _mla(heads: int, d_c: int, d_rope: int, qk_nope: int, d_v: int) -> LayerSpec:
    # kv_heads/d_k/d_v of an mla layer describe the decompressed heads used for compute.
    return LayerSpec("mla", kv_heads=heads, d_k=qk_nope + d_rope, d_v=d_v, d_c=d_c, d_rope=d_rope)


# -- builders -----------------------------------------------------------------------------


def _smollm2_135m(p: Preset) -> ArchSpec:
    return ArchSpec(
        name=p.name,
        layers=uniform_layers(30, _gqa(3, 64)),
        n_query_heads=9,
        hidden_size=576,
        params=134_515_008,
        vocab_size=49_152,
        max_position=8_192,
        source=p.source,
    )


def _llama_31(p: Preset, n_layers: int, hidden: int, heads: int, params: int) -> ArchSpec:
    return ArchSpec(
        name=p.name,
        layers=uniform_layers(n_layers, _gqa(8, 128)),
        n_query_heads=heads,
        hidden_size=hidden,
        params=params,
        vocab_size=128_256,
        max_position=131_072,
        source=p.source,
    )


def _llama_31_8b(p: Preset) -> ArchSpec:
    return _llama_31(p, 32, 4_096, 32, 8_030_261_248)


def _llama_31_70b(p: Preset) -> ArchSpec:
    return _llama_31(p, 80, 8_192, 64, 70_553_706_496)


def _llama_31_405b(p: Preset) -> ArchSpec:
    return _llama_31(p, 126, 16_384, 128, 405_853_388_800)


def _llama_2_7b(p: Preset) -> ArchSpec:
    return ArchSpec(
        name=p.name,
        layers=uniform_layers(32, _gqa(32, 128)),
        n_query_heads=32,
        hidden_size=4_096,
        params=6_738_415_616,
        vocab_size=32_000,
        max_position=4_096,
        source=p.source,
    )


def _mistral_7b(p: Preset) -> ArchSpec:
    return ArchSpec(
        name=p.name,
        layers=uniform_layers(32, _swa(8, 128, 4_096)),
        n_query_heads=32,
        hidden_size=4_096,
        params=7_241_732_096,
        vocab_size=32_000,
        max_position=32_768,
        source=p.source,
    )


def _mixtral_8x7b(p: Preset) -> ArchSpec:
    return ArchSpec(
        name=p.name,
        layers=uniform_layers(32, _gqa(8, 128)),
        n_query_heads=32,
        hidden_size=4_096,
        params=46_702_792_704,
        active_params=12_879_925_248,
        vocab_size=32_000,
        max_position=32_768,
        source=p.source,
        notes=("8 experts, 2 routed per token: active parameters are counted from the shapes",),
    )


def _gemma_3_270m(p: Preset) -> ArchSpec:
    return ArchSpec(
        name=p.name,
        layers=interleaved_layers(18, _swa(1, 256, 512), _gqa(1, 256), period=6),
        n_query_heads=4,
        hidden_size=640,
        params=268_098_176,
        vocab_size=262_144,
        max_position=32_768,
        source=p.source,
        notes=("head_dim 256 is not hidden/heads (640/4 = 160)",),
    )


def _gemma_3_27b(p: Preset) -> ArchSpec:
    return ArchSpec(
        name=p.name,
        layers=interleaved_layers(62, _swa(16, 128, 1_024), _gqa(16, 128), period=6),
        n_query_heads=32,
        hidden_size=5_376,
        params=27_009_346_304,
        vocab_size=262_208,
        max_position=131_072,
        source=p.source,
        notes=(
            "text decoder only (the ~0.4B SigLIP vision encoder is not counted)",
            "head_dim 128 is not hidden/heads (5376/32 = 168)",
        ),
    )


# MXFP4 stores 32 4-bit values with one shared 8-bit scale: 4.25 bits per parameter.
MXFP4_BYTES = 4.25 / 8


def _gpt_oss(p: Preset, n_layers: int, params: int, active: int, experts: int) -> ArchSpec:
    layers = tuple(_swa(8, 64, 128) if i % 2 == 0 else _gqa(8, 64) for i in range(n_layers))
    # Active = dense + 4/E of the experts, total = dense + all experts: solve for the experts.
    expert_params = (params - active) * experts // (experts - 4)
    weight_bytes = expert_params * MXFP4_BYTES + (params - expert_params) * 2
    return ArchSpec(
        name=p.name,
        layers=layers,
        n_query_heads=64,
        hidden_size=2_880,
        params=params,
        active_params=active,
        vocab_size=201_088,
        max_position=131_072,
        weight_dtype_bytes=weight_bytes / params,
        weight_format="MXFP4 experts and BF16 rest, as published",
        source=p.source,
        notes=(
            f"{experts} experts, 4 routed per token",
            "head_dim 64 is not hidden/heads (2880/64 = 45)",
            "weights as published: MoE experts in MXFP4 (4.25 bits per parameter), the rest "
            "in BF16",
        ),
    )


def _gpt_oss_120b(p: Preset) -> ArchSpec:
    return _gpt_oss(p, 36, 116_830_000_000, 5_130_000_000, 128)


def _gpt_oss_20b(p: Preset) -> ArchSpec:
    return _gpt_oss(p, 24, 20_910_000_000, 3_610_000_000, 32)


def _deepseek_v3(p: Preset) -> ArchSpec:
    return ArchSpec(
        name=p.name,
        layers=uniform_layers(61, _mla(128, 512, 64, 128, 128)),
        n_query_heads=128,
        hidden_size=7_168,
        params=671_000_000_000,
        active_params=37_000_000_000,
        vocab_size=129_280,
        max_position=163_840,
        weight_dtype_bytes=1,
        weight_format="FP8, as published",
        source=p.source,
        notes=(
            "671B main-model parameters (the 14B multi-token-prediction module is excluded)",
            "weights as published: FP8 (1 byte per parameter; --weights-bytes changes it)",
        ),
    )


def _qwen3_8b(p: Preset) -> ArchSpec:
    return ArchSpec(
        name=p.name,
        layers=uniform_layers(36, _gqa(8, 128)),
        n_query_heads=32,
        hidden_size=4_096,
        params=8_190_735_360,
        vocab_size=151_936,
        max_position=40_960,
        source=p.source,
        notes=("use_sliding_window is false: every layer is global",),
    )


def _jamba_v01(p: Preset) -> ArchSpec:
    mamba = LayerSpec(
        "recurrent",
        recurrent=RecurrentState("mamba", d_model=4_096, d_state=16, d_conv=4, expand=2),
    )
    return ArchSpec(
        name=p.name,
        layers=interleaved_layers(32, mamba, _gqa(8, 128), period=8, global_offset=4),
        n_query_heads=32,
        hidden_size=4_096,
        params=52_000_000_000,
        active_params=12_000_000_000,
        vocab_size=65_536,
        max_position=262_144,
        source=p.source,
        notes=("Mamba state is counted at the cache dtype width",),
    )


KIMI_LINEAR_MLA_LAYERS: tuple[int, ...] = (4, 8, 12, 16, 20, 24, 27)  # counted from 1


def _kimi_linear(p: Preset) -> ArchSpec:
    mla = _mla(32, 512, 64, 128, 128)
    kda = LayerSpec("recurrent", recurrent=RecurrentState("kda", heads=32, head_dim=128))
    layers = tuple(mla if i + 1 in KIMI_LINEAR_MLA_LAYERS else kda for i in range(27))
    return ArchSpec(
        name=p.name,
        layers=layers,
        n_query_heads=32,
        hidden_size=2_304,
        params=48_000_000_000,
        active_params=3_000_000_000,
        vocab_size=163_840,
        max_position=1_048_576,
        source=p.source,
        notes=(
            "KDA state counts heads x 128 x 128 per layer; the short-conv tails are not counted",
        ),
    )


_HF = "config.json of huggingface.co/"

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "smollm2-135m",
            "the default model: 30 layers, GQA 9 query / 3 KV heads of 64",
            _HF + "HuggingFaceTB/SmolLM2-135M-Instruct",
            _smollm2_135m,
        ),
        Preset(
            "llama-3.1-8b",
            "32 layers, GQA 32 query / 8 KV heads of 128",
            _HF + "meta-llama/Llama-3.1-8B",
            _llama_31_8b,
        ),
        Preset(
            "llama-3.1-70b",
            "80 layers, GQA 64 query / 8 KV heads of 128",
            _HF + "meta-llama/Llama-3.1-70B",
            _llama_31_70b,
        ),
        Preset(
            "llama-3.1-405b",
            "126 layers, GQA 128 query / 8 KV heads of 128",
            _HF + "meta-llama/Llama-3.1-405B",
            _llama_31_405b,
        ),
        Preset(
            "llama-2-7b",
            "32 layers, MHA 32 heads of 128",
            _HF + "meta-llama/Llama-2-7b-hf",
            _llama_2_7b,
        ),
        Preset(
            "mistral-7b-v0.1",
            "32 layers, GQA 8 KV heads of 128, sliding window 4096 in every layer",
            _HF + "mistralai/Mistral-7B-v0.1",
            _mistral_7b,
        ),
        Preset(
            "mixtral-8x7b",
            "32 layers, GQA 8 KV heads of 128, MoE 8 experts / 2 active",
            _HF + "mistralai/Mixtral-8x7B-v0.1",
            _mixtral_8x7b,
        ),
        Preset(
            "gemma-3-270m",
            "18 layers, 1 KV head of 256, window 512, one global layer in six",
            _HF + "google/gemma-3-270m",
            _gemma_3_270m,
        ),
        Preset(
            "gemma-3-27b",
            "62 layers, 16 KV heads of 128, window 1024, one global layer in six",
            _HF + "google/gemma-3-27b-it (text_config); Gemma 3 technical report",
            _gemma_3_27b,
        ),
        Preset(
            "gpt-oss-120b",
            "36 layers, 8 KV heads of 64, banded window 128 on alternate layers, MoE",
            _HF + "openai/gpt-oss-120b; gpt-oss model card (116.83B total, 5.13B active)",
            _gpt_oss_120b,
        ),
        Preset(
            "gpt-oss-20b",
            "24 layers, 8 KV heads of 64, banded window 128 on alternate layers, MoE",
            _HF + "openai/gpt-oss-20b; gpt-oss model card (20.91B total, 3.61B active)",
            _gpt_oss_20b,
        ),
        Preset(
            "deepseek-v3",
            "61 MLA layers, latent 512 + rope 64, 128 heads, MoE 671B / 37B active",
            _HF + "deepseek-ai/DeepSeek-V3; DeepSeek-V3 technical report (arXiv 2412.19437)",
            _deepseek_v3,
        ),
        Preset(
            "qwen3-8b",
            "36 layers, GQA 32 query / 8 KV heads of 128, no sliding window",
            _HF + "Qwen/Qwen3-8B; Qwen3 model card (8.2B parameters)",
            _qwen3_8b,
        ),
        Preset(
            "jamba-v0.1",
            "32 layers: attention (8 KV heads of 128) on one in eight, Mamba on the rest",
            _HF + "ai21labs/Jamba-v0.1; Jamba paper (arXiv 2403.19887): 52B total, 12B active",
            _jamba_v01,
        ),
        Preset(
            "kimi-linear-48b-a3b",
            "27 layers: MLA on 7, Kimi Delta Attention (32 heads x 128) on 20",
            _HF + "moonshotai/Kimi-Linear-48B-A3B-Instruct; Kimi Linear report "
            "(arXiv 2510.26692): 48B total, 3B active",
            _kimi_linear,
        ),
    )
}


def list_presets() -> list[tuple[str, str, str]]:
    """(name, source, short description) for every preset, in a stable order."""
    return [(p.name, p.source, p.description) for p in PRESETS.values()]


def get_preset(name: str) -> ArchSpec:
    """Build the named preset; an unknown name is a user mistake listing the known ones."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise CtxlabError(
            f"unknown architecture preset {name!r}; known presets: {', '.join(PRESETS)}"
        )
    preset = PRESETS[key]
    return preset.build(preset)
