"""`load_model`: a name, a .gguf file or an HF folder -> model, tokenizer and config.

GGUF tensors are dequantized to float with the `gguf` package (ctxlab runs the dequantized
weights; it does not emulate quantized kernels). llama.cpp stores Q and K of `llama`-arch
models with rows permuted for its interleaved RoPE; they are permuted back so the half-split
rotation (as in transformers) applies, the same correction transformers' GGUF loader makes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ctxlab.errors import CtxlabError
from ctxlab.inputs import load_json
from ctxlab.model.architectures import architecture, check_weight_format
from ctxlab.model.config import ModelConfig
from ctxlab.model.gguf_blocks import unpermute_qk
from ctxlab.model.gguf_file import GGUFFile, read_gguf_file
from ctxlab.model.huge_pages import move_into_huge_pages
from ctxlab.model.llama import LlamaModel
from ctxlab.model.registry import DEFAULT_MODEL, resolve_model_path
from ctxlab.model.tokenizer import Tokenizer, load_tokenizer
from ctxlab.model.weights import DEFAULT_WEIGHTS, check_weights, convert_weights
from ctxlab.model.weights_cache import cached_tensors

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_GGUF_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


@dataclass
class LoadedModel:
    """A ready model plus what belongs with it; the tokenizer is built on first use (slow)."""

    model: LlamaModel  # or a subclass: the architecture registry picks it
    config: ModelConfig
    source_path: Path
    _tokenizer: Tokenizer | None = field(default=None, repr=False)
    rope_override: str | None = None  # `--rope-scaling` applied on load (rope_override.py)

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(str(self.source_path), self.config.eos_token_ids)
        return self._tokenizer


@contextmanager
def _no_random_init() -> Iterator[None]:
    """Skip torch's random init of the meta-device modules: the checkpoint overwrites every
    weight, and `normal_` on a meta tensor imports torch._dynamo (2.7 s of every start)."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "ones_", "zeros_")
    saved = {name: getattr(torch.nn.init, name) for name in names}
    try:
        for name in names:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise CtxlabError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}.")
    return DTYPES[dtype]


def load_model(
    model: str = DEFAULT_MODEL,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    weights: str = DEFAULT_WEIGHTS,
    rope_scaling: str | None = None,
) -> LoadedModel:
    """Load a registry name (default: smollm2-135m), a .gguf file or an HF safetensors folder.

    `weights` stores the linear layers as fp32, fp32-onednn, bf16, int8 or int4
    (`ctxlab.model.weights`);
    `rope_scaling` (`linear:F`, `dynamic:F`, `yarn:F` or none) scales RoPE on a checkpoint
    that does not (`ctxlab.model.rope_override`).
    """
    from ctxlab.model.rope_override import RopeOverride, apply_rope_override

    RopeOverride.parse(rope_scaling)  # a bad value is one sentence before any tensor is read
    torch_dtype = parse_dtype(dtype)
    check_weights(weights)
    path = resolve_model_path(model)
    if path.is_dir():
        cfg, tensors, freq_factors = _read_hf_folder(path, weights)
    elif path.suffix.lower() == ".gguf":
        cfg, tensors, freq_factors = read_gguf(path, weights)
    else:
        raise CtxlabError(
            f"{path} is neither a .gguf file nor a folder with config.json and safetensors."
        )
    with torch.device("meta"), _no_random_init():
        net = architecture(cfg.arch).model(cfg, freq_factors)
    net.load_hf_state_dict(tensors, dtype=torch_dtype, device=device)
    del tensors
    if weights != "fp32":
        convert_weights(net, weights, path if path.suffix.lower() == ".gguf" else None)
    move_into_huge_pages(net)  # decode streams every weight each step: 2 MiB pages
    net.eval()
    return apply_rope_override(LoadedModel(model=net, config=cfg, source_path=path), rope_scaling)


# ---------------------------------------------------------------------- GGUF


def read_gguf(
    path: Path, weights: str | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor], torch.Tensor | None]:
    """Config, HF-named float32 tensors and optional RoPE frequency factors from a GGUF file.

    `weights`: the format the caller will convert to, refused here (before any tensor is
    dequantized) when the file's architecture cannot run it. The tensors come from the
    weights cache when an earlier process dequantized them (`ctxlab.model.weights_cache`)."""
    parsed = read_gguf_file(path)
    names = {t.name for t in parsed.tensors}
    vocab = parsed.metadata.get("tokenizer.ggml.tokens", 0)
    if not parsed.tensors:
        raise CtxlabError(f"{path} holds a GGUF header but no tensors, so no weights to run.")
    cfg = ModelConfig.from_gguf_fields(parsed.metadata, names, int(vocab), str(path))
    arch = architecture(cfg.arch)
    if weights is not None:
        check_weight_format(arch, weights, str(parsed.metadata.get("general.name") or path.name))
    tensors, freq_factors = cached_tensors(path, lambda: _dequantize(path, parsed, cfg))
    return cfg, tensors, freq_factors


def _dequantize(
    path: Path, parsed: GGUFFile, cfg: ModelConfig
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """HF-named float32 tensors (norm offsets applied, llama Q/K unpermuted) and the RoPE
    frequency factors, dequantized from the file (what `weights_cache` stores)."""
    import gguf

    arch = architecture(cfg.arch)
    layer_names = arch.gguf_layer_names
    tensors: dict[str, torch.Tensor] = {}
    freq_factors = None
    for t in parsed.tensors:
        qtype = gguf.GGMLQuantizationType(t.qtype)
        try:
            array = gguf.quants.dequantize(t.data, qtype)
        except NotImplementedError as exc:
            raise CtxlabError(
                f"{path} holds tensor {t.name} as {qtype.name}, which gguf cannot dequantize."
            ) from exc
        value = torch.from_numpy(np.array(array, dtype=np.float32, order="C"))
        if t.name == "rope_freqs.weight":
            freq_factors = value
            continue
        if arch.gguf_norm_offset and t.name.endswith("norm.weight"):
            value = value - arch.gguf_norm_offset
        if t.name in _GGUF_TOP_NAMES:
            tensors[_GGUF_TOP_NAMES[t.name]] = value
            continue
        parts = t.name.split(".", 2)
        if len(parts) != 3 or parts[0] != "blk" or parts[2] not in layer_names:
            raise CtxlabError(f"{path} holds tensor {t.name}, which ctxlab does not know.")
        if cfg.arch == "llama" and parts[2].startswith(("attn_q.", "attn_k.")):
            heads = cfg.num_heads if parts[2].startswith("attn_q.") else cfg.num_kv_heads
            value = unpermute_qk(value, heads)
        tensors[f"model.layers.{parts[1]}.{layer_names[parts[2]]}"] = value
    return tensors, freq_factors


# ---------------------------------------------------------------------- HF folder


def _read_hf_folder(
    path: Path, weights: str | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor], None]:
    from safetensors.torch import load_file

    config_file = path / "config.json"
    files = sorted(path.glob("*.safetensors"))
    if not config_file.is_file() or not files:
        raise CtxlabError(f"{path} needs a config.json and at least one *.safetensors file.")
    doc = load_json(config_file, "config")
    if not isinstance(doc, dict):
        raise CtxlabError(f"config {config_file}: the top level must be a JSON object.")
    cfg = ModelConfig.from_hf_dict(doc)
    if weights is not None:
        check_weight_format(architecture(cfg.arch), weights, path.name)
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except Exception as exc:
            raise CtxlabError(f"{f} is not a readable safetensors file.") from exc
    return cfg, tensors, None
