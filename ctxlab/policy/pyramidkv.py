"""`pyramidkv`: SnapKV scoring with budgets that shrink with layer depth.

Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
Funneling" (2024, arXiv:2406.02069). Parameters copied: the observation window (32) is kept
in every layer; the rest of the average per-layer budget is spread as an arithmetic sequence
from the bottom layer to the top, the top layer getting 1/beta of the average (beta = 20),
so the total over layers equals the flat budget's total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ctxlab.errors import CtxlabError
from ctxlab.policy.observation import LayerView
from ctxlab.policy.snapkv import SnapKVPolicy


def pyramid_budgets(avg_budget: int, n_layers: int, window: int, beta: float = 20.0) -> list[int]:
    """Per-layer token budgets, bottom to top, summing to `avg_budget * n_layers`."""
    if avg_budget < window:
        raise CtxlabError(
            f"a budget of {avg_budget} tokens is too small for pyramidkv: its observation window "
            f"alone keeps {window} tokens."
        )
    free = avg_budget - window
    if n_layers == 1:
        return [avg_budget]
    top = free / beta
    bottom = 2 * free - top
    step = (bottom - top) / (n_layers - 1)
    raw = [bottom - i * step for i in range(n_layers)]
    base = [int(r) for r in raw]
    # Largest-remainder rounding keeps the total exact.
    short = free * n_layers - sum(base)
    order = sorted(range(n_layers), key=lambda i: (raw[i] - base[i], -i), reverse=True)
    for i in order[:short]:
        base[i] += 1
    return [window + b for b in base]


@dataclass
class PyramidKVPolicy(SnapKVPolicy):
    """SnapKV with a per-layer budget from `pyramid_budgets`."""

    name: ClassVar[str] = "pyramidkv"
    paper: ClassVar[str] = "PyramidKV (Cai et al., 2024)"
    beta: float = 20.0

    def lane_budget(self, obs: LayerView) -> int:
        avg = self.lift(self.budget.tokens_for(obs.prompt_len))
        return pyramid_budgets(avg, obs.n_layers, self.obs_window, self.beta)[obs.layer]
