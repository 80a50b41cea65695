"""Tensor parallelism across N identical devices: what is split and what is copied.

With tensor parallelism of degree N each rank takes a share of the KV heads. When a layer
has fewer KV heads than ranks, heads are copied so every rank has one, so the layer's cache
is stored N / kv_heads times. An MLA latent is shared by all heads and cannot be split by
head, so every rank keeps the whole latent: N copies. Recurrent state is split by head like
K/V (Mamba by inner channel). Peaks add up across ranks (an ideal, no communication).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from ctxlab.arch.spec import ArchSpec, LayerSpec
from ctxlab.errors import CtxlabError
from ctxlab.plan.devices import Device


def check_gpus(gpus: int) -> None:
    if gpus <= 0:
        raise CtxlabError(f"the number of GPUs must be positive, got {gpus}")


def replication(layer: LayerSpec, gpus: int) -> Fraction:
    """How many copies of this layer's cache exist across `gpus` tensor-parallel ranks."""
    check_gpus(gpus)
    if gpus == 1 or layer.kind == "none":
        return Fraction(1)
    if layer.kind == "mla":
        return Fraction(gpus)
    if layer.kind == "recurrent":
        assert layer.recurrent is not None
        if layer.recurrent.kind == "mamba":
            return Fraction(1)  # inner channels split across ranks
        return max(Fraction(1), Fraction(gpus, max(layer.recurrent.heads, 1)))
    return max(Fraction(1), Fraction(gpus, layer.kv_heads))


def scaled_device(device: Device, gpus: int) -> Device:
    """N devices seen as one: memory, FLOP/s and bandwidth summed."""
    check_gpus(gpus)
    if gpus == 1:
        return device
    return replace(
        device,
        name=f"{gpus} x {device.name}",
        peak_flops=device.peak_flops * gpus,
        mem_bandwidth=device.mem_bandwidth * gpus,
        memory_bytes=device.memory_bytes * gpus,
    )


def accepts_tp(arch: ArchSpec, tp: int) -> bool:
    """Whether vLLM accepts `tp` for this model: the query heads split evenly
    (vllm/config/model.py: verify_with_parallel_config) and every attention layer's KV heads
    either split evenly or are copied evenly (its QKV projection); an MLA latent is copied."""
    if tp <= 0 or arch.n_query_heads % tp:
        return False
    return all(
        layer.kv_heads % tp == 0 or tp % layer.kv_heads == 0
        for layer in arch.layers
        if layer.kind in ("full", "sliding")
    )


def tp_at_least(arch: ArchSpec, n: int, limit: int) -> int | None:
    """The smallest tensor-parallel size >= n that vLLM accepts, None when none up to limit."""
    return next((tp for tp in range(max(n, 1), limit + 1) if accepts_tp(arch, tp)), None)


def heads_phrase(arch: ArchSpec) -> str:
    kv = sorted({layer.kv_heads for layer in arch.layers if layer.kind in ("full", "sliding")})
    kv_text = f" and {'/'.join(map(str, kv))} KV heads" if kv else ""
    return f"{arch.n_query_heads} query heads{kv_text}"
