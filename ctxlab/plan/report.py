"""The planner's one implementation of its numbers: `build_plan(...) -> dict`.

The CLI (`ctxlab plan`, tables and `--json`), the tour and the web lab (`/api/plan`) all
call `build_plan`, so a figure can never differ between them. The dict is JSON-ready
(ints, floats, strings, lists, dicts only). Schema ("ctxlab.plan/1"):

- `schema`: "ctxlab.plan/1".
- `arch`: {name, source, n_layers, layer_kinds {label: count}, n_query_heads, params,
  active_params, cache_dtype_bytes, weight_dtype_bytes, notes [str]}.
- `device`: {name, peak_flops (FLOP/s), mem_bandwidth (bytes/s), memory_bytes, source};
  with `gpus` > 1 the sums over all GPUs (name "N x device").
- `inputs`: {contexts [tokens], concurrency, page_size, shared_prefix_tokens,
  output_tokens, gpus, gpus_source ("given", or why that count was chosen), cache_dtype
  (name or null), weights_bytes, weights_source, reserve_bytes, reserve_source, prices
  (dict or null: the flat prices given, null when a rate card was), rate_card (null, or
  `RateCard.to_dict()`: name, date, currency, region, tier, source, unit_tokens, prices [one
  per length tier: above_tokens, input, output, cache_write, cache_read], self_hosted rates),
  self_hosted (dict or null), currency (the rate card's when one is given)}.
- `kv_bytes_per_token`: int, logical bytes one more token costs over all growing layers.
- `contexts`: the context lengths, in the order given.
- `sections`: {name: {`layer`, `title`, `summary` {...}, `rows` [one dict per context]}},
  in this order; `layer` says which layer of the stack the section belongs to:
  - `memory` (representation): summary {kv_bytes_per_token, kv_bytes_per_token_by_kind,
    fixed_state_bytes_per_request, growth_stops_at_tokens, trained_length (tokens, 0 when
    unknown)}; rows {context_tokens, beyond_trained_length (bool), kv_bytes_per_request,
    kv_bytes_per_request_by_kind, kv_bytes_for_concurrency}.
  - `paging` (allocation): summary {page_size}; rows {context_tokens,
    allocated_tokens_per_request, wasted_tokens_per_request, allocated_bytes_per_request,
    wasted_bytes_per_request, peak_allocated_bytes_per_request (the most a request holds on
    its way to this length: sliding layers' page counts go up and down),
    allocated_bytes_for_concurrency}.
  - `sharing` (sharing): summary {requests, shared_prefix_tokens}; rows {context_tokens,
    prefix_tokens_shared, bytes_without_sharing, bytes_avoided_by_sharing,
    bytes_with_sharing, bytes_avoided_full_pages}.
  - `capacity` (capacity): summary {gpus, device_memory_bytes (all GPUs), weights_bytes,
    reserve_bytes, kv_budget_bytes}; rows {context_tokens, tokens_per_request (context plus
    `output_tokens`: what a request holds by its end), kv_bytes_per_request_all_gpus (peak
    page-rounded bytes at tokens_per_request, with tensor-parallel copies),
    max_concurrent_requests (int, or null when a request holds no cache), concurrency_fits
    (bool), capacity_sentence}.
  - `compute` (compute): summary {device, peak_flops, mem_bandwidth}; rows {context_tokens,
    prefill_flops, prefill_weight_flops, prefill_attention_flops, prefill_seconds,
    attention_flops_share, decode_weight_bytes_per_step, decode_cache_bytes_per_step,
    decode_bytes_per_step, decode_seconds_per_token, decode_batch_seconds_per_step}.
  - `cost` (cost), present only when prices or rates are given: summary {prices,
    rate_card, self_hosted, currency}; rows {context_tokens, hosted_cold_cost,
    hosted_warm_cost (cold: the shared prefix is written to the provider cache; warm: it is
    read back; both bill context - prefix uncached input and `output_tokens` output),
    hosted_tier (the length tier the whole prompt falls in: "base" or "> N tokens"),
    self_hosted_gpu_seconds (per request at roofline, or the run's given total),
    self_hosted_gpu_seconds_source, self_hosted_requests {succeeded, failed, cancelled},
    self_hosted_cost_terms {device, cpu, network, storage, idle_reserve} (the run's bill,
    term by term: `ctxlab.plan.self_hosted`), self_hosted_total_cost,
    self_hosted_cost_per_success, self_hosted_cost_per_token (per token processed by any
    request, failed ones included)}; cost keys are null when their prices are not given.
- `per_context`: one dict per context length merging every section's row (keys are
  unique across sections), e.g. `plan["per_context"][1]["kv_bytes_per_request"]`.
- `engine` (allocation by a real engine): null, or with `engine=EngineRequest(...)` the
  engine's KV pool at one `max_model_len` (`ctxlab.plan.engines.pool.EnginePool.to_dict`:
  engine, version, basis ("from the engine's source" or "from the engine's documentation,
  not measured here"), block_size, pool_bytes, bytes_per_block, num_blocks, groups [{kind,
  layers, block_size, block_bytes, blocks_per_request, reserved_tokens_per_request, rule}],
  blocks_per_request, bytes_per_request, max_concurrency (the engine's own figure),
  kv_cache_tokens, requests, ideal_bytes_per_request, ideal_concurrency, ideal_requests,
  overhead_bytes_per_request, requests_lost, unused_pool_bytes, starts, refusal, log_line,
  rules [{rule, source}], notes) plus title, max_model_len_source, storage_sentence and
  product_sentence.
- `notes`: caveats in plain sentences (roofline bounds, defaults used).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ctxlab.arch.spec import ArchSpec
from ctxlab.plan import capacity, compute, cost, inputs, memory, paging, sharing
from ctxlab.plan.devices import Device, get_device
from ctxlab.plan.engines.section import EngineRequest, engine_section
from ctxlab.plan.rate_card import RateCard
from ctxlab.plan.self_hosted import SelfHostedPrices, Usage, self_hosted_bill

SCHEMA = "ctxlab.plan/1"

DEFAULT_OUTPUT_TOKENS = 256

SECTION_LAYERS: dict[str, tuple[str, str]] = {
    "memory": ("representation", "Logical KV cache"),
    "paging": ("allocation", "Page rounding"),
    "sharing": ("sharing", "Ideal prefix sharing"),
    "capacity": ("capacity", "Capacity of the KV pool"),
    "compute": ("compute", "Prefill and decode at roofline"),
    "cost": ("cost", "Cost per request"),
}


def _section(name: str, summary: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    layer, title = SECTION_LAYERS[name]
    return {"layer": layer, "title": title, "summary": summary, "rows": rows}


def _resolve(arch: ArchSpec | str, device: Device | str) -> tuple[ArchSpec, Device]:
    if isinstance(arch, str):
        from ctxlab.arch import resolve_arch

        arch = resolve_arch(name=arch)
    if isinstance(device, str):
        device = get_device(device)
    return arch, device


def build_plan(
    arch: ArchSpec | str,
    contexts: Sequence[int],
    *,
    device: Device | str = "h100",
    concurrency: int = 1,
    page_size: int = 16,
    shared_prefix: int = 0,
    cache_dtype: str | None = None,
    weights_bytes: int | None = None,
    reserve_bytes: int | None = None,
    output_tokens: int = DEFAULT_OUTPUT_TOKENS,
    prices: cost.HostedPrices | RateCard | None = None,
    self_hosted: cost.SelfHostedRates | None = None,
    gpus: int | None = 1,
    currency: str = "USD",
    engine: EngineRequest | None = None,
) -> dict[str, Any]:
    """Every planner figure for `arch` at each context length; see the module docstring.

    `gpus=None` plans on the fewest devices that hold the weights plus the reserve and says
    so in `inputs.gpus_source`; a given count that cannot hold them is one sentence naming
    the count that would. `prices` is a dated `RateCard` (length tiers; its currency wins)
    or flat `HostedPrices`, priced as a one-tier card."""
    arch, one_device = _resolve(arch, device)
    arch = memory.with_cache_dtype(arch, cache_dtype)
    contexts = [int(c) for c in contexts]
    card = prices if isinstance(prices, RateCard) else None
    if isinstance(prices, cost.HostedPrices):
        card = RateCard.flat(prices, currency)
    flat = asdict(prices) if isinstance(prices, cost.HostedPrices) else None
    if isinstance(prices, RateCard):
        currency = prices.currency
    inputs.check_inputs(contexts, concurrency, page_size, shared_prefix, output_tokens, gpus)

    notes: list[str] = []
    weights = arch.weight_bytes if weights_bytes is None else weights_bytes
    weights_source = arch.weight_format if weights_bytes is None else "given"
    chosen = inputs.choose_gpus(arch, one_device, gpus, weights, weights_source, reserve_bytes)
    gpus, gpus_source, device, reserve = chosen
    if reserve_bytes is None:
        reserve_source = "default: 10% of device memory (vLLM gpu_memory_utilization 0.9)"
    else:
        reserve_source = "given"
    budget = capacity.kv_budget(device.memory_bytes, weights, reserve)
    trained = arch.max_position

    mem_rows, page_rows, share_rows, cap_rows, comp_rows, cost_rows = [], [], [], [], [], []
    for context in contexts:
        req = memory.request_memory(arch, context, concurrency)
        mem_rows.append(
            {
                "context_tokens": context,
                "beyond_trained_length": bool(trained) and context > trained,
                "kv_bytes_per_request": req.bytes_per_request,
                "kv_bytes_per_request_by_kind": req.bytes_by_kind,
                "kv_bytes_for_concurrency": req.bytes_for_concurrency,
            }
        )
        paged = paging.paged_request(arch, context, page_size, gpus)
        page_rows.append(
            {
                "context_tokens": context,
                "allocated_tokens_per_request": paged.allocated_tokens,
                "wasted_tokens_per_request": paged.wasted_tokens,
                "allocated_bytes_per_request": paged.allocated_bytes,
                "wasted_bytes_per_request": paged.wasted_bytes,
                "peak_allocated_bytes_per_request": paged.peak_allocated_bytes,
                "allocated_bytes_for_concurrency": paged.allocated_bytes * concurrency,
            }
        )
        shared = sharing.prefix_sharing(arch, context, concurrency, shared_prefix, page_size)
        share_rows.append(
            {
                "context_tokens": context,
                "prefix_tokens_shared": shared.prefix_tokens,
                "bytes_without_sharing": shared.bytes_without_sharing,
                "bytes_avoided_by_sharing": shared.bytes_avoided,
                "bytes_with_sharing": shared.bytes_with_sharing,
                "bytes_avoided_full_pages": shared.bytes_avoided_full_pages,
            }
        )
        # a request holds its context and, by its end, every token it generates
        held = context + output_tokens
        at_end = paging.paged_request(arch, held, page_size, gpus) if output_tokens else paged
        fits = capacity.max_concurrent(budget.kv_bytes, at_end.peak_bytes_all_gpus)
        cap_rows.append(
            {
                "context_tokens": context,
                "tokens_per_request": held,
                "kv_bytes_per_request_all_gpus": at_end.peak_bytes_all_gpus,
                "max_concurrent_requests": fits,
                "concurrency_fits": fits is None or fits >= concurrency,
                "capacity_sentence": capacity.capacity_sentence(
                    fits, held, at_end.peak_bytes_all_gpus, budget.kv_bytes, gpus, output_tokens
                ),
            }
        )
        pre = compute.prefill(arch, context, device)
        dec = compute.decode(arch, context, device, weights, batch=concurrency)
        comp_rows.append(
            {
                "context_tokens": context,
                "prefill_flops": pre.flops,
                "prefill_weight_flops": pre.weight_flops,
                "prefill_attention_flops": pre.attention_flops,
                "prefill_seconds": pre.seconds,
                "attention_flops_share": pre.attention_share,
                "decode_weight_bytes_per_step": dec.weight_bytes,
                "decode_cache_bytes_per_step": dec.cache_bytes,
                "decode_bytes_per_step": dec.bytes_per_step,
                "decode_seconds_per_token": dec.seconds_per_token,
                "decode_batch_seconds_per_step": dec.batch_seconds_per_step,
            }
        )
        if card is not None or self_hosted is not None:
            cost_rows.append(
                _cost_row(
                    context,
                    shared_prefix,
                    output_tokens,
                    concurrency,
                    pre,
                    dec,
                    card,
                    self_hosted,
                )
            )

    sections = {
        "memory": _section(
            "memory",
            {
                "kv_bytes_per_token": memory.kv_bytes_per_token(arch),
                "kv_bytes_per_token_by_kind": memory.kv_bytes_per_token_by_kind(arch),
                "fixed_state_bytes_per_request": arch.fixed_state_bytes(),
                "growth_stops_at_tokens": memory.growth_stops_at(arch),
                "trained_length": trained,
            },
            mem_rows,
        ),
        "paging": _section("paging", {"page_size": page_size}, page_rows),
        "sharing": _section(
            "sharing", {"requests": concurrency, "shared_prefix_tokens": shared_prefix}, share_rows
        ),
        "capacity": _section(
            "capacity",
            {
                "gpus": gpus,
                "device_memory_bytes": device.memory_bytes,
                "weights_bytes": weights,
                "reserve_bytes": reserve,
                "kv_budget_bytes": budget.kv_bytes,
            },
            cap_rows,
        ),
        "compute": _section(
            "compute",
            {
                "device": device.name,
                "peak_flops": device.peak_flops,
                "mem_bandwidth": device.mem_bandwidth,
            },
            comp_rows,
        ),
    }
    if cost_rows:
        sections["cost"] = _section(
            "cost",
            {
                "prices": flat,
                "rate_card": card.to_dict() if card else None,
                "self_hosted": asdict(self_hosted) if self_hosted else None,
                "currency": currency,
            },
            cost_rows,
        )

    beyond = [c for c in contexts if trained and c > trained]
    if beyond:
        notes.append(
            f"{', '.join(f'{c:,}' for c in beyond)} tokens (marked *) are beyond "
            f"{arch.name}'s trained length of {trained:,} tokens: the bytes and times are "
            "arithmetic; the model was not trained to use that much context."
        )
    if gpus_source != "given" and gpus > 1:
        notes.append(f"Planned on {gpus} x {one_device.name}: {gpus_source}.")
    tp_warning = inputs.tp_note(arch, gpus)
    if tp_warning:
        notes.append(tp_warning)
    notes.append(
        "Times are rooflines at the device's peak FLOP/s and memory bandwidth: lower bounds."
    )
    if gpus > 1:
        notes.append(
            f"{gpus} GPUs in tensor parallel: memory, FLOP/s and bandwidth are summed (no "
            "communication cost); capacity counts KV heads copied to ranks that lack one and "
            "MLA latents copied to every rank."
        )
    if any(layer.kind == "recurrent" for layer in arch.layers):
        notes.append(
            "Recurrent layers hold a fixed state per request; prefix sharing saves their "
            "prefill compute, not their memory, and their state updates count as weight FLOPs."
        )
    if arch.active_params is not None and arch.active_params < arch.params:
        vision = any(note.startswith("vision tower counted") for note in arch.notes)
        # a vision tower alone is a few percent of the weights; far below is expert routing
        moe = not vision or arch.active_params * 1.2 <= arch.params
        if moe:
            notes.append(
                "Mixture of experts: prefill FLOPs use active parameters; one request's decode "
                "step reads the active share of the weights."
            )
        if vision:
            notes.append(
                "Vision tower: its weights are counted; text tokens do not pass through it, so "
                "prefill FLOPs and decode reads use the text decoder's parameters."
            )

    engine_out = None
    if engine is not None:
        engine_out = engine_section(
            arch,
            engine,
            device_memory_bytes=one_device.memory_bytes,
            weights_bytes=weights,
            gpus=gpus,
            contexts=contexts,
        )

    per_context = []
    for i in range(len(contexts)):
        merged: dict[str, Any] = {}
        for section in sections.values():
            merged.update(section["rows"][i])
        per_context.append(merged)

    return {
        "schema": SCHEMA,
        "arch": {
            "name": arch.name,
            "source": arch.source,
            "n_layers": arch.n_layers,
            "layer_kinds": arch.kind_counts(),
            "n_query_heads": arch.n_query_heads,
            "params": arch.params,
            "active_params": arch.active_params,
            "cache_dtype_bytes": arch.cache_dtype_bytes,
            "weight_dtype_bytes": arch.weight_dtype_bytes,
            "weight_format": arch.weight_format,
            "trained_length": trained,
            "notes": list(arch.notes),
        },
        "device": {
            "name": device.name,
            "peak_flops": device.peak_flops,
            "mem_bandwidth": device.mem_bandwidth,
            "memory_bytes": device.memory_bytes,
            "source": device.source,
        },
        "inputs": {
            "contexts": contexts,
            "concurrency": concurrency,
            "page_size": page_size,
            "shared_prefix_tokens": shared_prefix,
            "output_tokens": output_tokens,
            "gpus": gpus,
            "gpus_source": gpus_source,
            "cache_dtype": cache_dtype,
            "weights_bytes": weights,
            "weights_source": weights_source,
            "reserve_bytes": reserve,
            "reserve_source": reserve_source,
            "prices": flat,
            "rate_card": card.to_dict() if card else None,
            "self_hosted": asdict(self_hosted) if self_hosted else None,
            "currency": currency,
        },
        "kv_bytes_per_token": memory.kv_bytes_per_token(arch),
        "contexts": contexts,
        "sections": sections,
        "per_context": per_context,
        "engine": engine_out,
        "notes": notes,
    }


def _cost_row(
    context: int,
    shared_prefix: int,
    output_tokens: int,
    concurrency: int,
    pre: compute.Prefill,
    dec: compute.Decode,
    card: RateCard | None,
    rates: cost.SelfHostedRates | None,
) -> dict[str, Any]:
    """Hosted cold/warm cost and the self-hosted bill at one context length."""
    prefix = min(shared_prefix, context)
    row: dict[str, Any] = {
        "context_tokens": context,
        "hosted_cold_cost": None,
        "hosted_warm_cost": None,
        "hosted_tier": None,
        "self_hosted_gpu_seconds": None,
        "self_hosted_gpu_seconds_source": None,
        "self_hosted_requests": None,
        "self_hosted_cost_terms": None,
        "self_hosted_total_cost": None,
        "self_hosted_cost_per_success": None,
        "self_hosted_cost_per_token": None,
    }
    if card is not None:
        uncached = context - prefix
        row["hosted_cold_cost"] = card.cost(
            uncached, output_tokens, cache_write_tokens=prefix
        ).total
        row["hosted_warm_cost"] = card.cost(uncached, output_tokens, cache_read_tokens=prefix).total
        row["hosted_tier"] = card.tier_label(context)
    if rates is not None:
        requests = rates.successes + rates.failed + rates.cancelled
        if rates.gpu_seconds is not None:
            gpu_seconds, source = rates.gpu_seconds, "given"
            device_seconds = gpu_seconds
        else:
            # One request's share of a batch of `concurrency`: its own prefill, then decode
            # steps whose weight reads are shared by the batch; every request of the run,
            # failed or cancelled ones too, at that time.
            gpu_seconds = pre.seconds + output_tokens * dec.batch_seconds_per_step / concurrency
            source = (
                f"roofline (prefill + {output_tokens} decode steps in a batch of {concurrency})"
            )
            device_seconds = gpu_seconds * requests
        usage = Usage(
            device_seconds=device_seconds,
            succeeded=rates.successes,
            failed=rates.failed,
            cancelled=rates.cancelled,
            cpu_seconds=rates.cpu_seconds,
            network_bytes=rates.network_bytes,
            storage_byte_seconds=rates.storage_byte_seconds,
            idle_reserve=rates.idle_reserve,
            tokens=(context + output_tokens) * requests,
        )
        prices = SelfHostedPrices(
            device_hourly=rates.gpu_hourly,
            cpu_hourly=rates.cpu_hourly,
            network_per_gb=rates.network_per_gb,
            storage_per_gb_month=rates.storage_per_gb_month,
        )
        bill = self_hosted_bill(usage, prices)
        row["self_hosted_gpu_seconds"] = gpu_seconds
        row["self_hosted_gpu_seconds_source"] = source
        row["self_hosted_requests"] = {
            "succeeded": rates.successes,
            "failed": rates.failed,
            "cancelled": rates.cancelled,
        }
        row["self_hosted_cost_terms"] = bill.terms()
        row["self_hosted_total_cost"] = bill.total
        row["self_hosted_cost_per_success"] = bill.per_success
        row["self_hosted_cost_per_token"] = bill.per_token
    return row
