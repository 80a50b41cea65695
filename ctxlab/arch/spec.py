"""What one retained token (or one request's fixed state) costs: the architecture record.

An `ArchSpec` is a list of `LayerSpec`s, one per layer, because modern models mix layer kinds
(Gemma 3 interleaves sliding and global layers, Jamba and Kimi Linear mix attention with
recurrent layers). Every byte count here is an exact integer; nothing is rounded until it is
printed. This module never imports torch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Literal

from ctxlab.errors import CtxlabError

LayerKind = Literal["full", "sliding", "mla", "recurrent", "none"]
RecurrentKind = Literal["mamba", "linear", "kda"]
LAYER_KINDS: tuple[str, ...] = ("full", "sliding", "mla", "recurrent", "none")


class ArchError(CtxlabError):
    """An architecture that cannot be built as described; the message is one sentence."""


@dataclass(frozen=True)
class RecurrentState:
    """Fixed per-request state of a recurrent layer, by the formula of its kind.

    - mamba: SSM state d_inner x d_state plus the causal-conv tail d_inner x (d_conv - 1),
      with d_inner = expand x d_model (Mamba-1 as in Jamba).
    - linear: linear attention keeps one r x d_v matrix per head (feature width r).
    - kda: Kimi Delta Attention keeps one d x d matrix per head.
    """

    kind: RecurrentKind
    heads: int = 1
    d_model: int = 0
    d_state: int = 0
    d_conv: int = 0
    expand: int = 0
    feature_dim: int = 0
    d_v: int = 0
    head_dim: int = 0
    dtype_bytes: int | None = None  # None: use the cache dtype width

    def elements(self) -> int:
        """Number of state elements one request holds in this layer."""
        if self.kind == "mamba":
            d_inner = self.expand * self.d_model
            return d_inner * self.d_state + d_inner * max(self.d_conv - 1, 0)
        if self.kind == "linear":
            return self.heads * self.feature_dim * self.d_v
        if self.kind == "kda":
            return self.heads * self.head_dim * self.head_dim
        raise ArchError(f"unknown recurrent kind {self.kind!r}; known: mamba, linear, kda")

    def state_bytes(self, cache_dtype_bytes: int) -> int:
        width = self.dtype_bytes if self.dtype_bytes is not None else cache_dtype_bytes
        return self.elements() * width


@dataclass(frozen=True)
class LayerSpec:
    """One layer's cache shape.

    `full` and `sliding` store K (kv_heads x d_k) and V (kv_heads x d_v) per token; `sliding`
    keeps at most `window` tokens. `mla` stores one latent of d_c plus the decoupled rope key of
    d_rope per token, shared by all heads (no separate V, so no factor 2). `recurrent` holds a
    fixed state per request. `none` caches nothing. `d_k`/`d_v` of an mla layer are the
    attention head dims used for compute, not cache.
    """

    kind: LayerKind
    kv_heads: int = 0
    d_k: int = 0
    d_v: int = 0
    window: int | None = None
    d_c: int = 0
    d_rope: int = 0
    recurrent: RecurrentState | None = None

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise ArchError(f"unknown layer kind {self.kind!r}; known: {', '.join(LAYER_KINDS)}")
        if self.kind in ("full", "sliding") and (
            self.kv_heads <= 0 or self.d_k <= 0 or self.d_v <= 0
        ):
            raise ArchError(f"a {self.kind} layer needs positive kv_heads, d_k and d_v")
        if self.kind == "sliding" and (self.window is None or self.window <= 0):
            raise ArchError("a sliding layer needs a positive window")
        if self.kind == "mla" and self.d_c <= 0:
            raise ArchError("an mla layer needs a positive latent width d_c")
        if self.kind == "recurrent" and self.recurrent is None:
            raise ArchError("a recurrent layer needs its state description")

    @property
    def grows_with_context(self) -> bool:
        return self.kind in ("full", "sliding", "mla")

    def elements_per_token(self) -> int:
        """Cache elements one retained token costs in this layer (0 for fixed-state layers)."""
        if self.kind in ("full", "sliding"):
            return self.kv_heads * (self.d_k + self.d_v)
        if self.kind == "mla":
            return self.d_c + self.d_rope
        return 0

    def bytes_per_token(self, dtype_bytes: float) -> int:
        return _whole_bytes(self.elements_per_token() * dtype_bytes)

    def resident_tokens(self, context: int) -> int:
        """Tokens this layer keeps for a sequence of `context` tokens."""
        if self.kind == "sliding":
            assert self.window is not None
            return min(context, self.window)
        if self.kind in ("full", "mla"):
            return context
        return 0

    def fixed_bytes(self, dtype_bytes: float) -> int:
        if self.kind == "recurrent":
            assert self.recurrent is not None
            return (
                _whole_bytes(self.recurrent.elements() * dtype_bytes)
                if (self.recurrent.dtype_bytes is None)
                else self.recurrent.state_bytes(int(dtype_bytes))
            )
        return 0

    def request_bytes(self, context: int, dtype_bytes: float) -> int:
        """Bytes this layer holds for one request of `context` tokens."""
        per_token = self.elements_per_token() * self.resident_tokens(context)
        return _whole_bytes(per_token * dtype_bytes) + self.fixed_bytes(dtype_bytes)

    def for_rank(self, tp: int) -> LayerSpec:
        """What one of `tp` tensor-parallel ranks holds of this layer.

        KV heads are split, a rank holding ceil(kv_heads / tp) (heads are replicated when
        tp > kv_heads). MLA's latent is shared by all heads, so every rank keeps all of it.
        Recurrent state splits with its heads (Mamba: with d_inner).
        """
        _check_tp(tp)
        if self.kind in ("full", "sliding"):
            return replace(self, kv_heads=_ceil_div(self.kv_heads, tp))
        if self.kind == "recurrent":
            assert self.recurrent is not None
            state = self.recurrent
            if state.kind == "mamba":
                state = replace(state, d_model=_ceil_div(state.d_model, tp))
            else:
                state = replace(state, heads=_ceil_div(state.heads, tp))
            return replace(self, recurrent=state)
        return self

    def label(self) -> str:
        if self.kind == "sliding":
            return f"sliding(window={self.window})"
        if self.kind == "mla":
            return f"mla(d_c={self.d_c}, d_rope={self.d_rope})"
        if self.kind == "recurrent":
            assert self.recurrent is not None
            return f"recurrent({self.recurrent.kind})"
        return self.kind


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_tp(tp: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp <= 0:
        raise ArchError(f"tensor-parallel size must be a positive integer, got {tp!r}")


def _whole_bytes(value: float) -> int:
    """Bytes are integers; sub-byte dtypes (4-bit) round up per group of elements."""
    whole = int(value)
    return whole if whole == value else whole + 1


@dataclass(frozen=True)
class ArchSpec:
    """A model as the cache sees it, plus what compute estimates need.

    `params` is the total parameter count (weights bytes); `active_params` is what one token
    multiplies through (MoE models activate a fraction). `cache_dtype_bytes` may be fractional
    for 4-bit caches (0.5).
    """

    name: str
    layers: tuple[LayerSpec, ...]
    n_query_heads: int
    hidden_size: int
    params: int
    active_params: int | None = None
    vocab_size: int = 0
    max_position: int = 0
    cache_dtype_bytes: float = 2
    weight_dtype_bytes: float = 2
    weight_format: str = "16-bit"  # how the weights are published, e.g. "FP8"
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.layers:
            raise ArchError(f"architecture {self.name!r} has no layers")
        if self.cache_dtype_bytes <= 0:
            raise ArchError(f"cache dtype width must be positive, got {self.cache_dtype_bytes}")

    # -- shape --------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def flops_params(self) -> int:
        """Parameters one token multiplies through (active parameters for MoE)."""
        return self.active_params if self.active_params is not None else self.params

    @property
    def weight_bytes(self) -> int:
        return _whole_bytes(self.params * self.weight_dtype_bytes)

    def kind_counts(self) -> dict[str, int]:
        return dict(Counter(layer.label() for layer in self.layers))

    def with_cache_dtype(self, dtype_bytes: float) -> ArchSpec:
        return replace(self, cache_dtype_bytes=dtype_bytes)

    # -- bytes --------------------------------------------------------------------------
    def kv_bytes_per_token(self) -> int:
        """Logical bytes one more retained token costs, summed over every token-growing layer.

        Sliding layers count here (below their window a token costs the same as in a global
        layer); `request_bytes` is what caps them.
        """
        return sum(layer.bytes_per_token(self.cache_dtype_bytes) for layer in self.layers)

    def kv_bytes_per_token_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for layer in self.layers:
            if layer.grows_with_context:
                key = layer.label()
                out[key] = out.get(key, 0) + layer.bytes_per_token(self.cache_dtype_bytes)
        return out

    def fixed_state_bytes(self) -> int:
        """Bytes one request holds whatever its length (recurrent layers)."""
        return sum(layer.fixed_bytes(self.cache_dtype_bytes) for layer in self.layers)

    def request_bytes(self, context: int) -> int:
        """Bytes one request of `context` tokens holds across all layers."""
        if context < 0:
            raise ArchError(f"context length must be non-negative, got {context}")
        return sum(layer.request_bytes(context, self.cache_dtype_bytes) for layer in self.layers)

    def request_bytes_by_kind(self, context: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for layer in self.layers:
            key = layer.label()
            out[key] = out.get(key, 0) + layer.request_bytes(context, self.cache_dtype_bytes)
        return out

    # -- tensor parallelism -----------------------------------------------------------
    def per_rank(self, tp: int) -> ArchSpec:
        """The cache one of `tp` tensor-parallel ranks holds (see `LayerSpec.for_rank`).

        Only the cache view changes; `params` stays the model total.
        """
        _check_tp(tp)
        if tp == 1:
            return self
        layers = tuple(layer.for_rank(tp) for layer in self.layers)
        return replace(self, name=f"{self.name} (per rank, tp={tp})", layers=layers)

    def kv_bytes_per_token_per_rank(self, tp: int) -> int:
        return self.per_rank(tp).kv_bytes_per_token()

    def request_bytes_per_rank(self, context: int, tp: int) -> int:
        return self.per_rank(tp).request_bytes(context)

    # -- what-ifs -----------------------------------------------------------------------
    def layer_indices(self, kind: str) -> tuple[int, ...]:
        """0-based indices of the layers of `kind` (full, sliding, mla, recurrent, none)."""
        return tuple(i for i, layer in enumerate(self.layers) if layer.kind == kind)

    def all_global(self) -> ArchSpec:
        """The same model with every sliding layer made global: what the window saves."""
        layers = tuple(
            replace(layer, kind="full", window=None) if layer.kind == "sliding" else layer
            for layer in self.layers
        )
        return replace(self, name=f"{self.name} (all global)", layers=layers)


def uniform_layers(n: int, layer: LayerSpec) -> tuple[LayerSpec, ...]:
    return tuple(layer for _ in range(n))


def interleaved_layers(
    n: int, local: LayerSpec, global_: LayerSpec, period: int, global_offset: int | None = None
) -> tuple[LayerSpec, ...]:
    """`n` layers where every `period`-th layer (by default the last of each period) is global."""
    offset = period - 1 if global_offset is None else global_offset
    return tuple(global_ if i % period == offset else local for i in range(n))
