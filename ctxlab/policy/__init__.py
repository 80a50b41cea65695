"""Retention, selection and storage-format policies for the KV cache.

Each policy is a small dataclass in its own file (its docstring names the paper and the
parameters copied). The engine shows a policy one layer at a time (`LayerObs`) and gets back,
per KV head, the sorted original positions to keep; `make_policy(name, budget=...)` builds
one by name.
"""

from ctxlab.policy.base import (
    LayerObs,
    Policy,
    ScorerPolicy,
    attention_probs,
    group_reduce,
    keep_to_slots,
)
from ctxlab.policy.budget import Budget
from ctxlab.policy.registry import POLICIES, describe_policies, make_policy, policy_names

__all__ = [
    "POLICIES",
    "Budget",
    "LayerObs",
    "Policy",
    "ScorerPolicy",
    "attention_probs",
    "describe_policies",
    "group_reduce",
    "keep_to_slots",
    "make_policy",
    "policy_names",
]
