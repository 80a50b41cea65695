"""From what a user passed (`policy=` name or object, `budget=`) to what the engine runs: the
policy, and the driver that applies it, or none (`full`, or `quant`, which is only the pool's
storage format).
"""

from __future__ import annotations

from typing import Any

from ctxlab.errors import CtxlabError
from ctxlab.kv.manager import KVCacheManager
from ctxlab.policy.base import Policy
from ctxlab.policy.driver import PolicyDriver
from ctxlab.policy.full import FullPolicy
from ctxlab.policy.quant import QuantPolicy, storage_format
from ctxlab.policy.registry import make_policy


def build_driver(
    policy: Any, budget: Any, kv: KVCacheManager, n_heads: int, rope: Any = None
) -> tuple[Policy | None, PolicyDriver | None]:
    """(policy, driver) for the engine; `full` and no policy need no driver at all."""
    if policy is None:
        if budget is not None:
            raise CtxlabError("a budget needs a policy; pass policy= (e.g. 'snapkv') as well.")
        return None, None
    if policy == "quant" or isinstance(policy, QuantPolicy):
        storage_format(policy, budget, None)  # a budget with quant is a user error
        if isinstance(policy, str):
            policy = make_policy("quant", fmt=kv.kv_format or "kivi4")
        return policy, None  # a storage format: the pool is quantized, nothing to drive
    if isinstance(policy, str):
        extra = {"page": kv.block_size} if policy == "quest" else {}
        policy = make_policy(policy, budget, **extra)
    elif not isinstance(policy, Policy):
        raise CtxlabError(f"policy must be a name or a Policy, got {type(policy).__name__}.")
    elif budget is not None:
        raise CtxlabError("give the budget inside the Policy object or by name, not both.")
    if isinstance(policy, FullPolicy):
        return policy, None
    if policy.name == "quest":  # Quest's pages are the pool's blocks
        policy.page = kv.block_size  # type: ignore[attr-defined]
    policy.check()
    return policy, PolicyDriver(policy, kv, n_heads, rope)
