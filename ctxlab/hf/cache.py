"""`PolicyCache`: a transformers `Cache` whose layers a ctxlab policy keeps.

Each layer (`PolicyLayer`) stores keys and values `[B, n_kv, L, d]` as transformers'
`DynamicLayer` does, plus the original position of every slot per KV head. Eviction really
drops rows: the layer's tensors are replaced by smaller ones, so `resident_bytes` (measured
from the tensors) falls. `get_seq_length` stays the number of tokens seen, so `generate`
keeps feeding only new tokens and their positions stay the original ones.

Batches must hold prompts of one length (no padding); beam search is not supported (the
far tier and the kept positions are per batch row).
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ctxlab.errors import CtxlabError
from ctxlab.hf.attention import ACTIVE
from ctxlab.policy.base import Policy


class PolicyLayer(DynamicLayer):
    """One layer: keys, values, the original positions they hold, and what the policy keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.positions: torch.Tensor | None = None  # [B, n_kv, L] original positions
        self.seen = 0  # tokens fed so far (the next one gets this position)
        self.step = 0  # decode steps done
        self.prefilled = False
        self.pruned = False  # rows were dropped: attention runs over positions, not indices
        self.acc: torch.Tensor | None = None  # [B, n_kv, L] accumulated attention (H2O)
        self.q_log: torch.Tensor | None = None  # [B, H, w, d] the last queries (float32)
        self.q_pos: torch.Tensor | None = None  # [w] their positions

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().update(key_states, value_states)
        B, n_kv, T, _ = key_states.shape
        new = torch.arange(self.seen, self.seen + T, device=keys.device).expand(B, n_kv, T)
        self.positions = new if self.positions is None else torch.cat((self.positions, new), -1)
        self.seen += T
        return keys, values

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values))

    def _refuse(self, *args: object, **kwargs: object) -> None:
        if self.seen:
            raise CtxlabError(
                "a ctxlab PolicyCache supports greedy and sampled decoding, not beams."
            )

    reorder_cache = batch_repeat_interleave = batch_select_indices = _refuse  # type: ignore[assignment]

    def crop(self, tokens_to_remove: int) -> None:
        raise CtxlabError("a ctxlab PolicyCache cannot be cropped (its rows are not in order).")


class LayerRuntime(Protocol):
    """What runs each layer's attention and hooks for the cache (`hf/runtime.HFRuntime`)."""

    policy: Policy

    def attend(
        self,
        st: PolicyLayer,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: object,
    ) -> tuple[torch.Tensor, None]: ...


class PolicyCache(Cache):
    """A transformers cache driven by a ctxlab policy (built by `ctxlab.hf.cache`)."""

    def __init__(self, runtime: LayerRuntime, n_layers: int):
        super().__init__(layers=[PolicyLayer() for _ in range(n_layers)])
        self.runtime = runtime
        self._updated: int | None = None

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: object,
        **kwargs: object,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        ACTIVE.set(self)
        self._updated = layer_idx
        return out

    def owns(self, layer: int | None, key: torch.Tensor) -> bool:
        """Whether the attention call for `layer` with these keys is this cache's."""
        return (
            layer is not None
            and layer == self._updated
            and layer < len(self.layers)
            and self.layers[layer].keys is key
        )

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: object,
    ) -> tuple[torch.Tensor, None]:
        """The attention of `module`'s layer by the runtime."""
        layer = self.layers[int(module.layer_idx)]
        assert isinstance(layer, PolicyLayer)
        return self.runtime.attend(layer, module, query, key, value, attention_mask, **kwargs)

    # -- what the cache holds -------------------------------------------------------------
    @property
    def policy(self) -> Policy:
        return self.runtime.policy

    def resident_bytes(self) -> int:
        """Bytes of the keys and values every layer holds, measured from the tensors."""
        return sum(layer.nbytes() for layer in self.layers)  # type: ignore[attr-defined]

    def kept_positions(self, layer: int, row: int = 0) -> list[list[int]]:
        """The original positions each KV head of `layer` keeps for batch row `row`."""
        pos = self.layers[layer].positions  # type: ignore[attr-defined]
        return [] if pos is None else pos[row].tolist()
