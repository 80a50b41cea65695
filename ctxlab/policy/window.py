"""`window`: keep the last W tokens, a rolling buffer.

Mistral 7B (Jiang et al., 2023, arXiv:2310.06825) uses a rolling buffer cache of W slots for
its sliding-window attention; applied here at inference to any model. Parameter copied: the
window W (here the budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ctxlab.policy.base import ScorerPolicy
from ctxlab.policy.observation import LayerView


@dataclass
class WindowPolicy(ScorerPolicy):
    """Score = position, so the top-`budget` tokens are exactly the most recent ones."""

    name: ClassVar[str] = "window"
    paper: ClassVar[str] = "Mistral 7B rolling buffer cache (Jiang et al., 2023)"

    def score(self, obs: LayerView) -> torch.Tensor:
        return obs.positions.float()
