"""The attention function that lets a `PolicyCache` see queries and attend over kept tokens.

A transformers cache only sees keys and values; SnapKV, TOVA and H2O need queries and
attention. transformers dispatches attention by name (`AttentionInterface`), so `install`
registers `"ctxlab"` (with sdpa's mask function) and switches the model to it. The function
hands the call to the `PolicyCache` that has just updated this layer (a context variable the
cache sets in `update`; the keys must be that very tensor), and to transformers' own sdpa
attention in every other case, so a model with the `"ctxlab"` implementation and any other
cache computes exactly what it did before.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from ctxlab.errors import CtxlabError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

NAME = "ctxlab"


class ActiveCache(Protocol):
    """What the attention function asks of the cache that updated a layer (`PolicyCache`)."""

    def owns(self, layer: int | None, key: torch.Tensor) -> bool: ...

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: object,
    ) -> tuple[torch.Tensor, None]: ...


ACTIVE: ContextVar[ActiveCache | None] = ContextVar("ctxlab_hf_cache", default=None)


@dataclass(frozen=True)
class AttnOptions:
    """The keyword arguments of transformers' attention call that ctxlab's attention
    honours: the logit scale, Gemma 2's logit softcap and the layer's sliding window."""

    scaling: float | None = None
    softcap: float | None = None
    sliding_window: int | None = None

    @classmethod
    def of(cls, kwargs: Mapping[str, object]) -> AttnOptions:
        if kwargs.get("s_aux") is not None:
            raise CtxlabError("ctxlab.hf does not run models with attention sinks (s_aux).")
        scaling, softcap, window = (kwargs.get(k) for k in ("scaling", "softcap", "sliding_window"))
        return cls(
            float(scaling) if isinstance(scaling, (int, float)) else None,
            float(softcap) if isinstance(softcap, (int, float)) else None,
            int(window) if isinstance(window, int) and window else None,
        )


def ctxlab_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    cache = ACTIVE.get()
    layer = getattr(module, "layer_idx", None)
    if cache is not None and cache.owns(layer, key):
        return cache.attend(module, query, key, value, attention_mask, **kwargs)
    return sdpa(module, query, key, value, attention_mask, **kwargs)


def sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' own sdpa attention (the model's attention without a policy)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def install(model: PreTrainedModel) -> None:
    """Register the `"ctxlab"` attention (once) and switch `model` to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, ctxlab_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    if model.config._attn_implementation != NAME:
        model.set_attn_implementation(NAME)
