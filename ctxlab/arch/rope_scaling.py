"""`--rope-scaling KIND:F`: which RoPE scaling a user asks for, parsed before a model loads.

Position interpolation (`linear`, Chen et al. 2023), dynamic NTK (`dynamic`) and YaRN
(`yarn`, Peng et al. 2023) stretch RoPE so positions past the trained length look like ones
the model saw. This is the request: the kind, the factor, the scaling dict a config.json
would carry and the caveat every command prints (the papers pair each method with
fine-tuning). `ctxlab.model.rope_override` applies it to a loaded model. Nothing here imports
torch, so a bad value is one sentence before any model loads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ctxlab.errors import CtxlabError

KINDS = ("linear", "dynamic", "yarn")


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


def scaled_positions(trained: int | None, text: str | None) -> int | None:
    """The positions a model trained to `trained` runs to: x F under `--rope-scaling TEXT`."""
    override = RopeOverride.parse(text)
    return trained if trained is None or override is None else override.positions(trained)
