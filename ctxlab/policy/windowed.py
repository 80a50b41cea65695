"""Which policies run on a model with sliding-window layers, and on which layers.

A sliding layer already keeps only its window: the engine hands back the blocks behind it
(`KVCacheManager.slide`), and its lanes keep lane index = position. So on such a model
(Gemma 2/3, Mistral) a retention policy acts on the full-attention (global) layers only,
a storage format (`quant`) stores every layer's blocks, and `full` changes nothing. These
policies are refused, with one sentence, before the model loads (`check_windowed`, called
by the CLI's early checks and by the engine):
- `streaming` (or any policy in cache-slot position mode) renumbers the positions of every
  layer's new tokens, which a sliding layer, never compacted, cannot follow;
- `quest`, `moba`, `dsa` and `nsa` narrow every layer's decode reads to pages (or tokens,
  or mean rows), and `recall` adds far-tier rows to every layer: none is implemented for
  sliding layers' windowed reads.
No torch here: the CLI checks a name against a GGUF header before it pays for torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxlab.errors import CtxlabError

if TYPE_CHECKING:
    from ctxlab.policy.base import Policy

REFUSED: dict[str, str] = {
    "streaming": "it renumbers every layer's positions (cache-slot positions), which a "
    "sliding-window layer's lanes cannot follow",
    "quest": "its page reads are not implemented for sliding-window layers",
    "recall": "its far tier is not implemented for sliding-window layers",
    "moba": "its page reads are not implemented for sliding-window layers",
    "dsa": "its token reads are not implemented for sliding-window layers",
    "nsa": "its page and compressed reads are not implemented for sliding-window layers",
}

# Where each runnable policy acts on a model with sliding layers (what `ctxlab policies`
# and the docs say); anything not named here is a retention policy: global layers only.
ACTS_ON: dict[str, str] = {
    "full": "no layer (keeps everything)",
    "quant": "every layer's blocks (a storage format)",
}
RETENTION = "full-attention (global) layers only; sliding layers keep their window"


def acts_on(name: str) -> str:
    """Which layers policy `name` acts on when the model has sliding layers."""
    if name in REFUSED:
        return "refused: " + REFUSED[name]
    return ACTS_ON.get(name, RETENTION)


def windowed_refusal(name: str, position_mode: str = "original") -> str | None:
    """The sentence refusing policy `name` on a model with sliding layers, or None."""
    if name in REFUSED:
        why = REFUSED[name]
    elif position_mode == "cache-slot":
        why = REFUSED["streaming"].replace("it renumbers", "cache-slot mode renumbers")
    else:
        return None
    return (
        f"policy {name!r} cannot run on a model with sliding-window layers: {why}; "
        "pick another policy (`ctxlab policies`) or a model without sliding layers."
    )


def check_windowed(policy: Policy | None) -> None:
    """Raise CtxlabError when `policy` (or a policy it wraps) is refused on a windowed model."""
    p = policy
    while p is not None:
        name = getattr(p, "name", "")
        sentence = windowed_refusal(name, str(getattr(p, "position_mode", "original")))
        if sentence is not None:
            raise CtxlabError(sentence)
        p = p.__dict__.get("base")
