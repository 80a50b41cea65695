"""Retention, selection and storage-format policies for the KV cache: pure decisions.

Each policy is a small dataclass in its own file (its docstring names the paper and the
parameters copied). The engine (or `ctxlab.hf`) shows a policy what it asked to see
(`LayerView`, `PageObs`, `FarObs`) and executes its answer: per KV head, the sorted original
positions to keep; the pages a decode step reads; the far blocks to bring back.
`make_policy(name, budget=...)` builds one by name; wrapping composes them
(`RecallPolicy(base=H2OPolicy(...))`, `QuantPolicy(fmt="kivi4", base=...)`).

The names below are exported lazily (a module `__getattr__`): importing this package, its
registry or its budget imports no torch, so the CLI checks a policy name and a budget
before it pays for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# exported name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "Keep": "ctxlab.policy.base",
    "Policy": "ctxlab.policy.base",
    "PolicyWrapper": "ctxlab.policy.base",
    "ScorerPolicy": "ctxlab.policy.base",
    "Budget": "ctxlab.policy.budget",
    "NEEDS": "ctxlab.policy.observation",
    "FarObs": "ctxlab.policy.observation",
    "LayerObs": "ctxlab.policy.observation",
    "LayerView": "ctxlab.policy.observation",
    "PageObs": "ctxlab.policy.observation",
    "attention_probs": "ctxlab.policy.observation",
    "group_reduce": "ctxlab.policy.observation",
    "POLICIES": "ctxlab.policy.registry",
    "check_policy_name": "ctxlab.policy.registry",
    "describe_policies": "ctxlab.policy.registry",
    "make_policy": "ctxlab.policy.registry",
    "policy_names": "ctxlab.policy.registry",
}

__all__ = [  # the keys of _EXPORTS, spelled out for linters and `import *`
    "NEEDS",
    "POLICIES",
    "Budget",
    "FarObs",
    "Keep",
    "LayerObs",
    "LayerView",
    "PageObs",
    "Policy",
    "PolicyWrapper",
    "ScorerPolicy",
    "attention_probs",
    "check_policy_name",
    "describe_policies",
    "group_reduce",
    "make_policy",
    "policy_names",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # what type checkers and editors see
    from ctxlab.policy.base import Keep, Policy, PolicyWrapper, ScorerPolicy
    from ctxlab.policy.budget import Budget
    from ctxlab.policy.observation import (
        NEEDS,
        FarObs,
        LayerObs,
        LayerView,
        PageObs,
        attention_probs,
        group_reduce,
    )
    from ctxlab.policy.registry import (
        POLICIES,
        check_policy_name,
        describe_policies,
        make_policy,
        policy_names,
    )
