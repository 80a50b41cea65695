"""Name -> policy, with its paper, parameters and defaults, and the stack layer it acts on.

`make_policy("snapkv", budget=256)` is how the engine, the CLI and the evaluation build a
policy; `describe_policies()` is what `ctxlab policies` prints.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ctxlab.errors import CtxlabError
from ctxlab.policy.base import Policy
from ctxlab.policy.bigbird import BigBirdPolicy
from ctxlab.policy.budget import Budget
from ctxlab.policy.full import FullPolicy
from ctxlab.policy.h2o import H2OPolicy
from ctxlab.policy.keydiff import KeyDiffPolicy
from ctxlab.policy.knorm import KNormPolicy
from ctxlab.policy.longformer import LongformerPolicy
from ctxlab.policy.pyramidkv import PyramidKVPolicy
from ctxlab.policy.quant import QuantPolicy
from ctxlab.policy.quest import QuestPolicy
from ctxlab.policy.recall import RecallPolicy
from ctxlab.policy.snapkv import SnapKVPolicy
from ctxlab.policy.streaming import StreamingPolicy
from ctxlab.policy.tova import TOVAPolicy
from ctxlab.policy.window import WindowPolicy

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        FullPolicy,
        WindowPolicy,
        StreamingPolicy,
        H2OPolicy,
        SnapKVPolicy,
        PyramidKVPolicy,
        TOVAPolicy,
        KNormPolicy,
        KeyDiffPolicy,
        QuantPolicy,
        QuestPolicy,
        RecallPolicy,
        LongformerPolicy,
        BigBirdPolicy,
    )
}

# Policies whose pure code exists but that the engine cannot run yet.
NOT_IN_ENGINE: frozenset[str] = frozenset()


def policy_names() -> list[str]:
    return list(POLICIES)


def make_policy(
    name: str, budget: Budget | int | float | str | None = None, **params: Any
) -> Policy:
    """Build and check a policy by name; unknown names/params and bad budgets are one sentence.

    The budget is parsed once here (`Budget.parse`); each class's `from_budget` says where
    it goes, so no policy is special-cased by name.
    """
    cls = POLICIES.get(name)
    if cls is None:
        raise CtxlabError(f"policy {name!r} is unknown; choose one of {', '.join(POLICIES)}.")
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in params:
        if key not in fields:
            raise CtxlabError(
                f"policy {name!r} has no parameter {key!r}; it takes {', '.join(sorted(fields))}."
            )
    policy = cls.from_budget(None if budget is None else Budget.parse(budget), **params)
    policy.check()
    return policy


def describe_policies() -> list[dict[str, Any]]:
    """One row per policy: name, stack layer, paper, parameters with their defaults."""
    rows = []
    for name, cls in POLICIES.items():
        params: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.default is not dataclasses.MISSING:
                params[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
                params[f.name] = value.name if isinstance(value, Policy) else value
        rows.append(
            {
                "name": name,
                "layer": cls.stack_layer,
                "paper": cls.paper,
                "params": params,
                "summary": (cls.__doc__ or "").strip().splitlines()[0],
                "in_engine": name not in NOT_IN_ENGINE,
            }
        )
    return rows
