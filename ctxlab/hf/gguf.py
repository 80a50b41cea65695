"""A transformers model (and its tokenizer) read from a GGUF file, with no download.

transformers reads GGUF itself, but `from_pretrained(gguf_file=...)` also wants the
`accelerate` package, which ctxlab does not depend on; building the model from the GGUF's
config and loading transformers' own dequantised tensors is the same reading minus the
device-placement helper. The default is the packaged SmolLM2-135M-Instruct, so
`ctxlab.hf` can be tried on a real model offline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def from_gguf(
    model: str = "smollm2-135m", dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(transformers model in eval mode, transformers tokenizer) of a GGUF file or registry name."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from ctxlab.model.registry import resolve_model_path
    from ctxlab.model.tokenizer import load_tokenizer

    path = resolve_model_path(model)
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with no_init_weights():  # every weight is overwritten below; random init costs seconds
        hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=hf)
    hf.load_state_dict({k: torch.as_tensor(v) for k, v in parsed["tensors"].items()}, strict=False)
    hf.tie_weights()
    return hf.eval(), load_tokenizer(str(path)).hf
