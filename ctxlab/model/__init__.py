"""Execution layer: a readable Llama-family decoder, its loaders and a dense reference backend.

Public API: `load_model`, `LoadedModel`, `LlamaModel`, `ModelConfig`, `AttentionBackend`,
`DenseBackend`, `greedy_generate`, `RotaryEmbedding`, `Tokenizer`. Importing this package
imports torch (the execution layer needs it); `ctxlab.arch`/`plan`/`sim` never import it.

OMP_WAIT_POLICY=PASSIVE (unless the user set it): with OpenMP's default spinning, a thread
waiting at a barrier burns the core its busy sibling needs whenever the CPU is shared, and
on a loaded 2-core machine a decode step went from 0.14 s to 3.6 s. It only takes effect if
torch was not imported before this package.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
