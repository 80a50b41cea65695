"""The plan's engine section: an engine's pool beside the ideal, in storage and product terms.

`build_plan(..., engine=EngineRequest(...))` puts this dict under `plan["engine"]`; the
tables print it. Storage terms: bytes one request takes in the engine's accounting against
the bytes it needs. Product terms: requests of `max_model_len` tokens that run at once,
against what the same pool would hold without the engine's rounding and reservations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxlab.arch.spec import ArchSpec
from ctxlab.plan.engines import predict_engine_pool
from ctxlab.plan.engines.pool import EnginePool, Platform
from ctxlab.plan.units import count_word, fmt_bytes

ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp"}


@dataclass(frozen=True)
class EngineRequest:
    """`ctxlab plan --engine`: the engine and the flags it is started with (None: its default)."""

    engine: str
    max_model_len: int | None = None
    kv_cache_bytes: int | None = None
    memory_utilization: float | None = None
    activation_bytes: int = 0
    platform: Platform = "gpu"
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    slots: int = 1
    disable_hybrid: bool = False


def engine_section(
    arch: ArchSpec,
    request: EngineRequest,
    *,
    device_memory_bytes: int,
    weights_bytes: int,
    gpus: int,
    contexts: list[int],
) -> dict[str, Any]:
    """The engine's pool for this plan's model and devices, with its two sentences.

    `max_model_len` defaults to vLLM's own default, the model's trained length, and to the
    longest planned context when the model does not state one."""
    if request.max_model_len is not None:
        mml, mml_source = request.max_model_len, "given"
    elif arch.max_position:
        mml, mml_source = arch.max_position, "the model's trained length (vLLM's default)"
    else:
        mml, mml_source = max(contexts), "the longest planned context"
    pool = predict_engine_pool(
        arch,
        request.engine,
        max_model_len=mml,
        kv_cache_bytes=request.kv_cache_bytes,
        device_memory_bytes=device_memory_bytes,
        memory_utilization=request.memory_utilization,
        weights_bytes=weights_bytes,
        activation_bytes=request.activation_bytes,
        platform=request.platform,
        tp=gpus,
        block_size=request.block_size,
        max_num_batched_tokens=request.max_num_batched_tokens,
        slots=request.slots,
        disable_hybrid=request.disable_hybrid,
    )
    out = pool.to_dict()
    out["title"] = ENGINE_TITLES.get(pool.engine, pool.engine)
    out["max_model_len_source"] = mml_source
    out["storage_sentence"] = storage_sentence(pool)
    out["product_sentence"] = product_sentence(pool)
    return out


def storage_sentence(pool: EnginePool) -> str:
    """Bytes per request, engine against ideal, and what the pool loses to whole blocks."""
    name = ENGINE_TITLES.get(pool.engine, pool.engine)
    mml = pool.settings.max_model_len
    ideal, engine = pool.ideal_bytes_per_request, pool.bytes_per_request
    head = (
        f"{name} takes {fmt_bytes(engine)} of its pool per request of {mml:,} tokens where the "
        f"model needs {fmt_bytes(ideal)}"
    )
    over = pool.overhead_bytes_per_request
    if over > 0 and ideal > 0:
        head += f": {fmt_bytes(over)} ({100 * over / ideal:.0f} %) is allocation overhead"
    elif over == 0:
        head += ": no overhead at this length"
    unused = pool.unused_pool_bytes
    if unused:
        head += f"; {fmt_bytes(unused)} of the pool is left over after whole blocks"
    return head + "."


def product_sentence(pool: EnginePool) -> str:
    """Requests that run at once, engine against ideal."""
    if pool.refusal:
        return pool.refusal[0].upper() + pool.refusal[1:] + "."
    name = ENGINE_TITLES.get(pool.engine, pool.engine)
    mml = pool.settings.max_model_len
    runs = pool.requests
    text = (
        f"{count_word(runs).capitalize()} request{'s' if runs != 1 else ''} of {mml:,} tokens "
        f"run{'s' if runs == 1 else ''} at once ({name} reports {pool.max_concurrency:.2f}x)"
    )
    ideal = pool.ideal_requests
    lost = pool.requests_lost
    if ideal is None or lost is None:
        return text + "."
    if lost > 0:
        return f"{text}; the same pool ideally holds {ideal:,}: {lost:,} lost to the allocation."
    return f"{text}; the same pool ideally holds {ideal:,}: none lost."
