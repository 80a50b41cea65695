"""Where to cut: the oldest share of the context, grown until the rest fits, at a turn start.

The cut starts at `first` (30 %) of the in-context messages, moves forward to the next turn
boundary, and grows by `step` (10 %) while the kept part does not fit. The newest turn is
never cut, so the current question and its context always stay; if even that does not fit
the caller reports a budget that cannot work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ctxlab.memory.messages import Message, turn_starts


def choose_cut(
    messages: Sequence[Message],
    fits: Callable[[int], bool],
    first: float = 0.30,
    step: float = 0.10,
) -> tuple[int, float]:
    """(index of the first kept message, the share that produced it); 0 means no cut."""
    starts = turn_starts(messages)
    newest = starts[-1]
    if newest == 0:
        return 0, 0.0
    n = len(messages)
    i = 0
    while True:
        share = first + i * step
        want = math.ceil(share * n - 1e-9)
        cut = min(next((s for s in starts if s >= max(want, 1)), newest), newest)
        if cut == newest or fits(cut):
            return cut, min(share, 1.0)
        i += 1
