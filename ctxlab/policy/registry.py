"""Name -> policy, with its paper, parameters and defaults, and the stack layer it acts on.

`make_policy("snapkv", budget=256)` is how the engine, the CLI and the evaluation build a
policy; `describe_policies()` is what `ctxlab policies` prints.

Registering a policy is one line in `REGISTERED`: its name and where its class lives
("module:Class"). A class is imported only when it is built or described, so checking a
name (`check_policy_name`) or a budget (`Budget.parse`) imports no torch: a typo on the
command line costs well under a second.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ctxlab.errors import CtxlabError
from ctxlab.policy.budget import Budget

if TYPE_CHECKING:
    from ctxlab.policy.base import Policy

REGISTERED: dict[str, str] = {
    "full": "ctxlab.policy.full:FullPolicy",
    "window": "ctxlab.policy.window:WindowPolicy",
    "streaming": "ctxlab.policy.streaming:StreamingPolicy",
    "h2o": "ctxlab.policy.h2o:H2OPolicy",
    "snapkv": "ctxlab.policy.snapkv:SnapKVPolicy",
    "pyramidkv": "ctxlab.policy.pyramidkv:PyramidKVPolicy",
    "tova": "ctxlab.policy.tova:TOVAPolicy",
    "knorm": "ctxlab.policy.knorm:KNormPolicy",
    "keydiff": "ctxlab.policy.keydiff:KeyDiffPolicy",
    "quant": "ctxlab.policy.quant:QuantPolicy",
    "quest": "ctxlab.policy.quest:QuestPolicy",
    "recall": "ctxlab.policy.recall:RecallPolicy",
    "longformer": "ctxlab.policy.longformer:LongformerPolicy",
    "bigbird": "ctxlab.policy.bigbird:BigBirdPolicy",
    "longformer-prefill": "ctxlab.policy.longformer:LongformerPrefillPolicy",
    "bigbird-prefill": "ctxlab.policy.bigbird:BigBirdPrefillPolicy",
    "moba": "ctxlab.policy.moba:MoBAPolicy",
    "dsa": "ctxlab.policy.dsa:DSAPolicy",
    "nsa": "ctxlab.policy.nsa:NSAPolicy",
}


class PolicyClasses(Mapping[str, "type[Policy]"]):
    """`REGISTERED` as name -> class: names and membership are free, a class is imported
    the first time it is looked up (its module imports torch)."""

    def __init__(self, where: Mapping[str, str]) -> None:
        self._where = where
        self._loaded: dict[str, type[Policy]] = {}

    def __getitem__(self, name: str) -> type[Policy]:
        if name not in self._loaded:
            module, _, attr = self._where[name].partition(":")
            cls = getattr(importlib.import_module(module), attr)
            if cls.name != name:  # a registration line that names the wrong class
                raise RuntimeError(f"policy {name!r} is registered as {cls.name!r} ({attr})")
            self._loaded[name] = cls
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where


POLICIES = PolicyClasses(REGISTERED)

# Policies whose pure code exists but that the engine cannot run yet.
NOT_IN_ENGINE: frozenset[str] = frozenset()


def policy_names() -> list[str]:
    return list(REGISTERED)


def check_policy_name(name: str) -> None:
    """An unknown policy name is one sentence; imports nothing (no torch)."""
    if name not in REGISTERED:
        raise CtxlabError(f"policy {name!r} is unknown; choose one of {', '.join(REGISTERED)}.")


def make_policy(
    name: str, budget: Budget | int | float | str | None = None, **params: Any
) -> Policy:
    """Build and check a policy by name; unknown names/params and bad budgets are one sentence.

    The budget is parsed once here (`Budget.parse`); each class's `from_budget` says where
    it goes, so no policy is special-cased by name.
    """
    check_policy_name(name)
    cls = POLICIES[name]
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
    """One row per policy: name, stack layer, paper, parameters with their defaults, and
    which layers it acts on in a model with sliding-window layers (`ctxlab.policy.windowed`)."""
    from ctxlab.policy.base import Policy
    from ctxlab.policy.windowed import acts_on

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
                "with_sliding_layers": acts_on(name),
            }
        )
    return rows
