"""Retention, selection and storage-format policies for the KV cache: pure decisions.

Each policy is a small dataclass in its own file (its docstring names the paper and the
parameters copied). The engine (or `ctxlab.hf`) shows a policy what it asked to see
(`LayerView`, `PageObs`, `FarObs`) and executes its answer: per KV head, the sorted original
positions to keep; the pages a decode step reads; the far blocks to bring back.
`make_policy(name, budget=...)` builds one by name; wrapping composes them
(`RecallPolicy(base=H2OPolicy(...))`, `QuantPolicy(fmt="kivi4", base=...)`).
"""

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
from ctxlab.policy.registry import POLICIES, describe_policies, make_policy, policy_names

__all__ = [
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
    "describe_policies",
    "group_reduce",
    "make_policy",
    "policy_names",
]
