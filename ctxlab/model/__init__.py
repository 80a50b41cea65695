"""Execution layer: a readable Llama-family decoder, its loaders and a dense reference backend.

Public API: `load_model`, `LoadedModel`, `LlamaModel`, `ModelConfig`, `AttentionBackend`,
`DenseBackend`, `greedy_generate`, `RotaryEmbedding`, `Tokenizer`. Importing this package
imports torch (the execution layer needs it); `ctxlab.arch`/`plan`/`sim` never import it.
"""

from ctxlab.model.backend import AttentionBackend
from ctxlab.model.config import ModelConfig
from ctxlab.model.dense import DenseBackend, greedy_generate, greedy_generate_batch
from ctxlab.model.llama import LlamaModel
from ctxlab.model.loader import LoadedModel, load_model
from ctxlab.model.registry import DEFAULT_MODEL
from ctxlab.model.rope import RotaryEmbedding
from ctxlab.model.tokenizer import Tokenizer

__all__ = [
    "DEFAULT_MODEL",
    "AttentionBackend",
    "DenseBackend",
    "LlamaModel",
    "LoadedModel",
    "ModelConfig",
    "RotaryEmbedding",
    "Tokenizer",
    "greedy_generate",
    "greedy_generate_batch",
    "load_model",
]
