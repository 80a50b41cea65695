"""Compute: prefill FLOPs and decode bytes, turned into roofline times on a device.

Prefill multiplies every token through the (active) weights, 2 FLOPs per parameter, and
through attention: for query position i a layer computes QK^T and AV over the keys it sees,
2 x H_q x (d_k + d_v) x keys FLOPs. Causal masking means position i sees i keys (a sliding
layer min(i, W)), which halves the square: about L^2 x H_q x (d_k + d_v) per full layer.
MLA layers use their attention head dims (the decompressed heads of prefill). Recurrent
layers' state updates are counted inside their weights only; `none` layers add nothing.

Decode is memory-bound at small batch: each step reads the weights once and that request's
whole cache. Both times are rooflines (device peaks), so they are lower bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxlab.arch.spec import ArchSpec, LayerSpec
from ctxlab.errors import CtxlabError
from ctxlab.plan.devices import Device


def attended_keys(context: int, window: int | None = None) -> int:
    """Sum over query positions 1..L of the keys each sees (causal, optionally windowed)."""
    if window is None or context <= window:
        return context * (context + 1) // 2
    return window * (window + 1) // 2 + (context - window) * window


def layer_attention_flops(layer: LayerSpec, n_query_heads: int, context: int) -> int:
    """QK^T plus AV FLOPs of one layer for a causal prefill of `context` tokens."""
    if layer.kind == "full":
        keys = attended_keys(context)
        d_k, d_v = layer.d_k, layer.d_v
    elif layer.kind == "sliding":
        keys = attended_keys(context, layer.window)
        d_k, d_v = layer.d_k, layer.d_v
    elif layer.kind == "mla":
        keys = attended_keys(context)
        # Without decompressed head dims, fall back to the absorbed form over the latent.
        d_k = layer.d_k or (layer.d_c + layer.d_rope)
        d_v = layer.d_v or layer.d_c
    else:
        return 0
    return 2 * n_query_heads * (d_k + d_v) * keys


@dataclass(frozen=True)
class Prefill:
    context: int
    weight_flops: int
    attention_flops: int
    seconds: float

    @property
    def flops(self) -> int:
        return self.weight_flops + self.attention_flops

    @property
    def attention_share(self) -> float:
        return self.attention_flops / self.flops if self.flops else 0.0


def prefill(arch: ArchSpec, context: int, device: Device) -> Prefill:
    """FLOPs of a prefill of `context` tokens and its time at the device's peak."""
    if context <= 0:
        raise CtxlabError(f"context length must be a positive number of tokens, got {context}")
    weight_flops = 2 * arch.flops_params * context
    attention = sum(
        layer_attention_flops(layer, arch.n_query_heads, context) for layer in arch.layers
    )
    return Prefill(
        context=context,
        weight_flops=weight_flops,
        attention_flops=attention,
        seconds=(weight_flops + attention) / device.peak_flops,
    )


def decode_weight_bytes(arch: ArchSpec, weights_bytes: int) -> int:
    """Weight bytes one decode step reads: all of them, or the active share for MoE."""
    if arch.active_params is None or arch.active_params >= arch.params:
        return weights_bytes
    return weights_bytes * arch.active_params // arch.params


@dataclass(frozen=True)
class Decode:
    context: int
    weight_bytes: int
    cache_bytes: int
    seconds_per_token: float
    batch: int
    batch_seconds_per_step: float

    @property
    def bytes_per_step(self) -> int:
        return self.weight_bytes + self.cache_bytes


def decode(
    arch: ArchSpec, context: int, device: Device, weights_bytes: int, batch: int = 1
) -> Decode:
    """Memory-bound decode: bytes read per step and the time per token at full bandwidth.

    `batch_seconds_per_step` is one step of `batch` requests together: weights read once,
    every request's cache read.
    """
    if context <= 0:
        raise CtxlabError(f"context length must be a positive number of tokens, got {context}")
    weights = decode_weight_bytes(arch, weights_bytes)
    cache = arch.request_bytes(context)
    return Decode(
        context=context,
        weight_bytes=weights,
        cache_bytes=cache,
        seconds_per_token=(weights + cache) / device.mem_bandwidth,
        batch=batch,
        batch_seconds_per_step=(weights + batch * cache) / device.mem_bandwidth,
    )
