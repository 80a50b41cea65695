"""`open_model`: load a model and its tokenizer under progress, for commands and the eval.

Loading the weights takes seconds and a first tokenizer build about ten more (later ones
come from the cache in half a second); a user sees both as progress on stderr.
"""

from __future__ import annotations

from ctxlab.model.loader import LoadedModel, load_model
from ctxlab.model.registry import model_label
from ctxlab.progress import progress


def open_model(
    model: str,
    dtype: str = "float32",
    *,
    weights: str = "fp32",
    enabled: bool = True,
    rope_scaling: str | None = None,
) -> LoadedModel:
    """A `LoadedModel` with its tokenizer built, each step shown as progress."""
    shown = dtype if weights == "fp32" else f"{dtype}, {weights} weights"
    if rope_scaling and rope_scaling.lower() != "none":
        shown += f", RoPE {rope_scaling}"
    with progress(f"loading {model_label(model)} ({shown})", enabled=enabled):
        loaded = load_model(model, dtype=dtype, weights=weights, rope_scaling=rope_scaling)
    with progress("loading the tokenizer", enabled=enabled):
        _ = loaded.tokenizer
    return loaded
