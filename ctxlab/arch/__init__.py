"""Representation layer: what one retained token, or one request's fixed state, costs.

Never imports torch. Callers use `resolve_arch` (preset name, config.json or GGUF) or
`get_preset`; the readers and spec classes are exported for tests and tools.
"""

from ctxlab.arch.gguf_meta import from_gguf
from ctxlab.arch.hf_config import from_hf_config
from ctxlab.arch.presets import PRESETS, get_preset, list_presets
from ctxlab.arch.resolve import resolve_arch
from ctxlab.arch.spec import (
    ArchError,
    ArchSpec,
    LayerSpec,
    RecurrentState,
    interleaved_layers,
    uniform_layers,
)

__all__ = [
    "PRESETS",
    "ArchError",
    "ArchSpec",
    "LayerSpec",
    "RecurrentState",
    "from_gguf",
    "from_hf_config",
    "get_preset",
    "interleaved_layers",
    "list_presets",
    "resolve_arch",
    "uniform_layers",
]
