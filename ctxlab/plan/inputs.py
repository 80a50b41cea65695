"""What the planner accepts: impossible or absurd inputs, and how many devices to plan on.

`build_plan` calls these before any per-layer arithmetic, so a shared prefix longer than the
context, a billion-token context or weights that fit no device count are one sentence, and
a preset too big for one device is planned on the fewest devices that hold it.
"""

from __future__ import annotations

from ctxlab.arch.limits import MAX_TOKENS, check_limit
from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError
from ctxlab.plan import capacity, parallel
from ctxlab.plan.devices import Device
from ctxlab.plan.units import fmt_bytes

# vLLM's default gpu_memory_utilization is 0.9: it leaves a tenth of the device for the rest.
DEFAULT_RESERVE_FRACTION = 0.10
MAX_PAGE_SIZE = 65_536  # tokens; real engines use 16 to 256


def check_inputs(
    contexts: list[int],
    concurrency: int,
    page_size: int,
    shared_prefix: int,
    output_tokens: int,
    gpus: int | None,
) -> None:
    """One sentence per impossible or absurd input."""
    if not contexts:
        raise CtxlabError("give at least one context length")
    for value, what in ((page_size, "page size"), (concurrency, "concurrency")):
        if value <= 0:
            raise CtxlabError(f"{what} must be a positive number, got {value}")
    if gpus is not None:
        parallel.check_gpus(gpus)
        check_limit(gpus, capacity.MAX_GPUS, "a GPU count")
    check_limit(page_size, MAX_PAGE_SIZE, "a page size", "tokens")
    check_limit(concurrency, MAX_TOKENS, "a concurrency", "requests")
    for context in contexts:
        if context <= 0:
            raise CtxlabError(f"context length must be a positive number of tokens, got {context}")
        check_limit(context, MAX_TOKENS, "a context", "tokens")
    if shared_prefix < 0:
        raise CtxlabError(f"shared prefix length must be zero or positive, got {shared_prefix}")
    if shared_prefix > max(contexts):  # shorter contexts share all they have (the lab's chart)
        raise CtxlabError(
            f"shared-prefix tokens ({shared_prefix:,}) cannot exceed the context length "
            f"({max(contexts):,})"
        )
    if output_tokens < 0:
        raise CtxlabError(f"output tokens must be zero or positive, got {output_tokens}")
    check_limit(output_tokens, MAX_TOKENS, "an output length", "tokens")


def choose_gpus(
    arch: ArchSpec,
    one: Device,
    gpus: int | None,
    weights: int,
    weights_source: str,
    reserve_bytes: int | None,
) -> tuple[int, str, Device, int]:
    """(gpus, why that count, the devices seen as one, reserve bytes).

    `gpus=None` picks the fewest devices whose memory holds the weights plus the reserve;
    a given count that cannot is one sentence naming the count that would."""
    if weights < 0 or (reserve_bytes is not None and reserve_bytes < 0):
        capacity.kv_budget(one.memory_bytes, weights, reserve_bytes or 0)  # its sentence
    need = capacity.gpus_for_weights(
        one.memory_bytes, weights, reserve_bytes, DEFAULT_RESERVE_FRACTION
    )
    source = "given"
    if need is not None:
        # what an engine would run: the smallest tensor-parallel size it accepts
        need = parallel.tp_at_least(arch, need, capacity.MAX_GPUS) or need
    if gpus is None:
        if need is None:
            raise _no_room(arch, weights, weights_source, reserve_bytes, 1, one, need)
        fewest = capacity.gpus_for_weights(
            one.memory_bytes, weights, reserve_bytes, DEFAULT_RESERVE_FRACTION
        )
        gpus = need
        source = (
            f"the fewest {one.name} that hold the weights ({fmt_bytes(weights)}, "
            f"{weights_source}) plus the reserve"
        )
        if fewest != need:
            source += (
                f" are {fewest}, rounded up to {need}, the smallest tensor-parallel size vLLM "
                f"accepts for {parallel.heads_phrase(arch)}"
            )
        source += "; --gpus N plans on another count"
    device = parallel.scaled_device(one, gpus)
    reserve = capacity.reserve_for(device.memory_bytes, reserve_bytes, DEFAULT_RESERVE_FRACTION)
    if weights + reserve >= device.memory_bytes:
        raise _no_room(arch, weights, weights_source, reserve, gpus, one, need)
    return gpus, source, device, reserve


def tp_note(arch: ArchSpec, gpus: int) -> str | None:
    """A sentence when a given GPU count is not a tensor-parallel size vLLM accepts."""
    if gpus == 1 or parallel.accepts_tp(arch, gpus):
        return None
    nearest = parallel.tp_at_least(arch, gpus, capacity.MAX_GPUS)
    fix = f"; the nearest above that it accepts is {nearest}" if nearest else ""
    return (
        f"{gpus} GPUs is not a tensor-parallel size vLLM accepts for "
        f"{parallel.heads_phrase(arch)} (heads must split evenly){fix}: the figures treat "
        f"the {gpus} devices as one."
    )


def _no_room(
    arch: ArchSpec,
    weights: int,
    weights_source: str,
    reserve: int | None,
    gpus: int,
    one: Device,
    need: int | None,
) -> CtxlabError:
    if reserve is None:
        reserve = int(one.memory_bytes * gpus * DEFAULT_RESERVE_FRACTION)
    return capacity.no_room(
        arch.name, weights, f", {weights_source}", reserve, gpus, one.name, one.memory_bytes, need
    )
