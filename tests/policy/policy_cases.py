"""Every registered policy, built for a test: registering a policy is what puts it here.

`build(name, budget)` gives the policy at `budget` tokens, or at the smallest multiple of it
the policy accepts (BigBird's random tokens and recall's recalled blocks need more room), or
without a budget for a policy that takes none (`full`, `quant`). `small=True` first shrinks
whatever fixed windows a class has (by field name, so a new policy with such a field is
shrunk too), for prompts of a few dozen tokens.
"""

from __future__ import annotations

import dataclasses

from ctxlab.errors import CtxlabError
from ctxlab.policy import POLICIES, Policy, make_policy, policy_names

SMALL = {
    "obs_window": 8,
    "recall_blocks": 2,
    "block": 4,
    "n_random": 4,
    "n_global": 2,
    "window": 4,
    "question": 4,
}


def build(name: str, budget: int, small: bool = False) -> Policy:
    defaults = {f.name: f.default for f in dataclasses.fields(POLICIES[name])}  # type: ignore[arg-type]
    # a window that is off by default stays off (plain Longformer's question: 0 tokens)
    params = {k: v for k, v in SMALL.items() if defaults.get(k, 0) != 0} if small else {}
    for b in (budget, 2 * budget, 3 * budget, 4 * budget):
        try:
            return make_policy(name, b, **params)
        except CtxlabError as exc:
            if "takes no budget" in str(exc) or "keeps every token" in str(exc):
                return make_policy(name)
    raise AssertionError(f"{name} accepts no budget up to {4 * budget} tokens")


def evicting(budget: int) -> list[tuple[str, Policy]]:
    """(name, policy) of every registered policy that evicts."""
    return [(n, p) for n in policy_names() if (p := build(n, budget)).evicts]


def evicting_names() -> list[str]:
    return [n for n, _ in evicting(64)]
