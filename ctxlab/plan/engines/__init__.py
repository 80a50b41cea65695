"""What a real engine allocates for the KV cache: one module per engine, one registry.

`predict_engine_pool(spec, engine="vllm", ...)` is the one entry point: `ctxlab plan
--engine` and `ctxlab probe` (beside a server's published and measured capacity) call it.
vLLM's rules are read from its source and reproduce its start-up figures exactly; SGLang's
and llama.cpp's come from their documentation and are marked so. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable

from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError
from ctxlab.plan.engines import llamacpp, sglang, vllm
from ctxlab.plan.engines.pool import EnginePool, EngineSettings, Platform

Predictor = Callable[[ArchSpec, EngineSettings], EnginePool]

ENGINES: dict[str, Predictor] = {
    "vllm": vllm.predict,
    "sglang": sglang.predict,
    "llamacpp": llamacpp.predict,
}


def engine_names() -> tuple[str, ...]:
    return tuple(ENGINES)


def predict_engine_pool(
    spec: ArchSpec,
    engine: str = "vllm",
    *,
    max_model_len: int,
    kv_cache_bytes: int | None = None,
    device_memory_bytes: int | None = None,
    memory_utilization: float | None = None,
    weights_bytes: int = 0,
    activation_bytes: int = 0,
    platform: Platform = "gpu",
    tp: int = 1,
    block_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    slots: int = 1,
    disable_hybrid: bool = False,
) -> EnginePool:
    """The engine's KV pool for `spec` started with these settings, the ideal beside it.

    None means the engine's default (block size, batch tokens, memory utilization)."""
    key = engine.strip().lower().replace(".", "").replace("-", "")
    if key not in ENGINES:
        raise CtxlabError(f"unknown engine {engine!r}; known engines: {', '.join(ENGINES)}")
    settings = EngineSettings(
        max_model_len=max_model_len,
        kv_cache_bytes=kv_cache_bytes,
        device_memory_bytes=device_memory_bytes,
        memory_utilization=memory_utilization,
        weights_bytes=weights_bytes,
        activation_bytes=activation_bytes,
        platform=platform,
        tp=tp,
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        slots=slots,
        disable_hybrid=disable_hybrid,
    )
    return ENGINES[key](spec, settings)


__all__ = ["ENGINES", "EnginePool", "EngineSettings", "engine_names", "predict_engine_pool"]
