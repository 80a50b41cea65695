"""The one ranking rule every policy's top-k uses, so a choice does not depend on the CPU.

`torch.topk` returns equal values in an order that depends on the kernel (and so on the
instruction set, the thread count and the device). A policy's choice must not: the same
prompt gives the same kept positions on any machine whenever the scores themselves agree.
The rule: higher score first; equal scores keep the lower index (an earlier slot, page or
far block) first. `best_first` applies it along the last dimension with one stable sort.

What no rule can fix is scores that differ between machines by float noise (MKL and oneDNN
sum in a different order per instruction set) and sit on either side of the cut: that near
tie flips on one CPU and not on another. The golden policy record therefore accepts a
different kept position only where this run's own scores put it within a stated tolerance
of the cut (tests/policy/golden_policies.py, `NearTies`), and `make test` reruns it under a
second instruction set.
"""

from __future__ import annotations

import torch


def best_first(scores: torch.Tensor) -> torch.Tensor:
    """Indices along the last dim by descending score; ties keep the lower index first."""
    return torch.argsort(scores, dim=-1, descending=True, stable=True)


def top_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The `k` best indices along the last dim, best first, under the rule above."""
    return best_first(scores)[..., :k]


def top_mask(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Which indices along the last dim are among the `k` best (`k` broadcast over the
    leading dims), under the rule above, without a full sort: every score above the k-th
    best VALUE (a value, so the same on any kernel), then the lowest indices among the
    scores equal to it. The same set as `top_indices(scores, k)`; `torch.topk` finds the
    k-th value several times faster than a stable sort of long rows on a CPU."""
    k = k.expand(scores.shape[:-1])
    K = max(1, min(int(k.max()), scores.shape[-1]))
    values = torch.topk(scores, K, dim=-1).values
    kth = values.gather(-1, (k.clamp(min=1, max=K) - 1)[..., None])
    above = scores > kth
    tied = scores == kth
    room = (k[..., None] - above.sum(-1, keepdim=True)).clamp(min=0)
    return (above | (tied & (tied.cumsum(-1) <= room))) & (k[..., None] > 0)
