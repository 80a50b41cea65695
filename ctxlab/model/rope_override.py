"""Applying `--rope-scaling` to a loaded model whose checkpoint does not ask for it.

The request (`ctxlab.arch.rope_scaling.RopeOverride`: kind, factor, the scaling dict) is
parsed before any model loads; here the model's rotary embedding is swapped for one built by
`ctxlab.model.rope` (checked against transformers) with that scaling. The model is then run
to `trained x F` positions: the config's `max_position` becomes that length and the scaling
dict keeps the trained one as `original_max_position_embeddings`, as Hugging Face configs of
scaled models spell it. On Gemma 3 only the global layers' rotation is scaled (as Gemma 3's
own long-context checkpoints do); its sliding layers see at most their window, which is
inside the trained range.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol, TypeVar

from ctxlab.arch.rope_scaling import RopeOverride
from ctxlab.errors import CtxlabError

if TYPE_CHECKING:
    from ctxlab.model.config import ModelConfig
    from ctxlab.model.llama import LlamaModel


class Loaded(Protocol):
    """What a scaling changes of a `LoadedModel` (named so here: the loader imports this)."""

    model: LlamaModel  # its `rope` and `config` are replaced
    config: ModelConfig
    rope_override: str | None


L = TypeVar("L", bound=Loaded)


def trained_length(config: ModelConfig) -> int:
    """The length a model was trained to: the scaling's original length when it has one."""
    scaling = getattr(config, "rope_scaling", None) or {}
    return int(scaling.get("original_max_position_embeddings") or config.max_position)


def apply_rope_override(loaded: L, text: str | None) -> L:
    """`loaded` with the scaling applied (the same object, changed in place); `none` leaves it
    as it is. A checkpoint that already scales RoPE is one sentence, and so is asking for a
    second, different scaling on a model already changed."""
    override = RopeOverride.parse(text)
    if override is None:
        return loaded
    cfg = loaded.config
    current = cfg.rope_scaling
    if current is not None:
        trained = trained_length(cfg)
        if current == override.scaling(trained) and getattr(loaded, "rope_override", None):
            return loaded  # already applied (a command handing its loaded model on)
        if getattr(loaded, "rope_override", None):
            raise CtxlabError(
                f"--rope-scaling {override.spec}: this model was already given "
                f"--rope-scaling {loaded.rope_override}; one scaling per loaded model."
            )
        raise CtxlabError(
            f"--rope-scaling {override.spec}: this checkpoint already scales RoPE "
            f"({current.get('rope_type')}); the option is for models whose checkpoint does not."
        )
    from ctxlab.model.rope import RotaryEmbedding

    trained = cfg.max_position
    scaling = override.scaling(trained)
    model = loaded.model
    old = model.rope
    # Built with the trained length: dynamic NTK grows its base from there.
    model.rope = RotaryEmbedding(old.head_dim, old.theta, scaling, trained, old.freq_factors)
    new_cfg = dataclasses.replace(
        cfg, rope_scaling=scaling, max_position=override.positions(trained)
    )
    model.config = new_cfg
    loaded.config = new_cfg
    loaded.rope_override = override.spec
    return loaded
