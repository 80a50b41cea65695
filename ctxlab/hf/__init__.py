"""ctxlab's policies on any transformers model: `ctxlab.hf.cache(model, policy, budget)`.

    cache = ctxlab.hf.cache(model, policy="snapkv", budget=0.25)
    out = model.generate(ids, cache=cache, max_new_tokens=64)   # past_key_values= before 5.x
    cache.resident_bytes()                                        # measured from the tensors

The same policy objects as the engine's (`ctxlab.policy`), decided the same way from the
same observations, drive a transformers cache (`PolicyCache`): eviction drops rows for real,
during decoding too (H2O, TOVA, SnapKV's re-runs, recall's far tier, Quest's page reads),
on any decoder-only model whose attention goes through transformers' `AttentionInterface`,
on any torch device. The model's attention implementation becomes `"ctxlab"`: transformers'
sdpa underneath, so every other cache computes what it did before.

Positions stay the original ones (transformers' `generate` assigns them), so a policy is
built with `position_mode="original"`; KV storage formats (`quant`) run in ctxlab's engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxlab.errors import CtxlabError
from ctxlab.hf.attention import install
from ctxlab.hf.cache import PolicyCache, PolicyLayer
from ctxlab.hf.gguf import from_gguf
from ctxlab.hf.runtime import HFRuntime

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ctxlab.policy import Policy
    from ctxlab.policy.budget import Budget

__all__ = ["PolicyCache", "PolicyLayer", "cache", "from_gguf", "install"]


def cache(
    model: PreTrainedModel,
    policy: str | Policy = "snapkv",
    budget: Budget | int | float | str | None = None,
    page: int = 16,
    **params: object,
) -> PolicyCache:
    """A fresh `PolicyCache` for one `generate` (or forward) call of `model`.

    `policy` is a name (`ctxlab policies`) with `budget` and its parameters, or a `Policy`
    object. `page` plays the engine's block size: Quest's page, and the schedule of decode
    cuts (a lane may run `page - 1` tokens over its budget before it is cut back).
    """
    from ctxlab.kv.layout import KVLayout
    from ctxlab.policy import Policy, make_policy

    if isinstance(policy, str):
        params.setdefault("position_mode", "original")
        policy = make_policy(policy, budget, **params)
    elif not isinstance(policy, Policy):
        raise CtxlabError(f"policy must be a name or a Policy, got {type(policy).__name__}.")
    elif budget is not None or params:
        raise CtxlabError("give the budget and parameters inside the Policy object, or a name.")
    policy.check()
    if policy.position_mode != "original":
        raise CtxlabError(
            "ctxlab.hf keeps original positions (transformers' generate assigns them); build "
            "the policy with position_mode='original'."
        )
    if policy.storage()[0] is not None:
        raise CtxlabError(
            "KV storage formats run in ctxlab's engine; ctxlab.hf runs retention and "
            "selection policies (transformers has its own QuantizedCache)."
        )
    if page < 1:
        raise CtxlabError(f"page must be at least 1 token, got {page}.")
    cfg = model.config.get_text_config(decoder=True)
    n_heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    layout = KVLayout(
        n_layers=cfg.num_hidden_layers,
        n_kv_heads=getattr(cfg, "num_key_value_heads", None) or n_heads,
        head_dim=head_dim,
        head_dim_v=head_dim,
        block_size=page,
        dtype=model.dtype,
    )
    install(model)
    return PolicyCache(HFRuntime(policy, layout, n_heads, page), layout.n_layers)
