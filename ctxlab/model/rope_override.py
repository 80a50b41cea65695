"""`--rope-scaling KIND:F`: a RoPE scaling method on a model whose checkpoint does not ask for it.

Position interpolation (`linear`, Chen et al. 2023), dynamic NTK (`dynamic`) and YaRN
(`yarn`, Peng et al. 2023) stretch RoPE so positions past the trained length look like ones
the model saw. The frequencies come from `ctxlab.model.rope` (checked against transformers);
this module only builds the scaling dict a config.json would carry and swaps the model's
rotary embedding. The papers pair each method with fine-tuning (a few hundred steps for PI
and YaRN); applied to the checkpoint as it is, which is all ctxlab can do, they show what
the rotation alone buys, and `CAVEAT` says so wherever the option is used.

The model is then run to `trained x F` positions: the config's `max_position` becomes that
length and the scaling dict keeps the trained one as `original_max_position_embeddings`,
as Hugging Face configs of scaled models spell it. On Gemma 3 only the global layers'
rotation is scaled (as Gemma 3's own long-context checkpoints do); its sliding layers see
at most their window, which is inside the trained range. Nothing here needs torch until a
model is changed, so flags are checked before a model loads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ctxlab.errors import CtxlabError

if TYPE_CHECKING:
    from ctxlab.model.config import ModelConfig
    from ctxlab.model.llama import LlamaModel

KINDS = ("linear", "dynamic", "yarn")


class Loaded(Protocol):
    """What a scaling changes of a `LoadedModel` (named so here: the loader imports this)."""

    model: LlamaModel  # its `rope` and `config` are replaced
    config: ModelConfig
    rope_override: str | None


L = TypeVar("L", bound=Loaded)

MAX_FACTOR = 64.0
CAVEAT = (
    "note: --rope-scaling {spec} is applied to the checkpoint as it is; position "
    "interpolation, NTK and YaRN are normally paired with fine-tuning at the longer length, "
    "so this shows what the rotation alone buys."
)


@dataclass(frozen=True)
class RopeOverride:
    """A parsed `--rope-scaling` value: the kind and its factor F."""

    kind: str
    factor: float

    @classmethod
    def parse(cls, text: str | None, flag: str = "--rope-scaling") -> RopeOverride | None:
        """`none` (or nothing) -> None; `linear:F`, `dynamic:F`, `yarn:F` with 1 <= F <= 64;
        anything else one sentence."""
        if text is None or text.strip().lower() in ("", "none"):
            return None
        kind, sep, value = text.strip().lower().partition(":")
        allowed = f"use none, {', '.join(k + ':F' for k in KINDS)} (e.g. yarn:2)"
        if kind not in KINDS or not sep:
            raise CtxlabError(f"{flag} {text!r} is not a scaling; {allowed}.")
        try:
            factor = float(value)
        except ValueError:
            factor = math.nan
        if not 1.0 <= factor <= MAX_FACTOR:
            raise CtxlabError(
                f"{flag} {text!r}: the factor F must be a number from 1 to {MAX_FACTOR:g}; "
                f"{allowed}."
            )
        return cls(kind, factor)

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.factor:g}"

    def scaling(self, trained: int) -> dict[str, Any]:
        """The `rope_scaling` dict (transformers' spelling) for a model trained to `trained`."""
        return {
            "rope_type": self.kind,
            "factor": self.factor,
            "original_max_position_embeddings": trained,
        }

    def positions(self, trained: int) -> int:
        """How far the scaled model is run: trained x F positions."""
        return int(trained * self.factor)


def caveat(text: str | None) -> str | None:
    """The one line a command prints when a scaling is given (None for none)."""
    override = RopeOverride.parse(text)
    return None if override is None else CAVEAT.format(spec=override.spec)


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
