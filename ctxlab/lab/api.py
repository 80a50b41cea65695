"""What `/api/plan` answers: the form validated, the planner called, its figures picked out.

This module computes no figure. It turns the form into an `ArchSpec` and planner arguments,
calls `ctxlab.plan.report.build_plan` (the same function behind `ctxlab plan --json`) once for
the selected context and the chart's context lengths, and picks the four figures out of the
plan, each with its unit, its denominator in words and its stack layer.
"""

from __future__ import annotations

import math
from dataclasses import replace
from http import HTTPStatus
from typing import Any

from ctxlab.arch import get_preset, list_presets
from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError
from ctxlab.lab.form import (
    FIELDS,
    FIELDS_BY_NAME,
    FormError,
    field_table,
    gib_to_bytes,
    parse_form,
)
from ctxlab.lab.rawarch import arch_from_fields
from ctxlab.plan.devices import get_device
from ctxlab.plan.report import build_plan
from ctxlab.plan.units import fmt_bytes

DEFAULT_PRESET = "llama-3.1-8b"
# Device memory is the only device figure the lab's outputs use; compute rates are borrowed
# from this preset so the planner can run, and the lab shows none of them.
RATES_DEVICE = "h100"
CHART_POINTS = 14


def preset_names() -> tuple[str, ...]:
    return tuple(name for name, _source, _desc in list_presets())


def lab_meta() -> dict[str, Any]:
    """Presets and the form's schema, for the page to fill its selects and labels."""
    return {
        "presets": [
            {"name": name, "source": source, "description": desc}
            for name, source, desc in list_presets()
        ],
        "default_preset": DEFAULT_PRESET,
        "fields": field_table(),
    }


def lab_arch(values: dict[str, Any]) -> ArchSpec:
    """The architecture the form describes, in the cache dtype width it asks for."""
    if values["arch"] == "raw":
        return arch_from_fields(values)
    arch = get_preset(values["preset"])
    width = values["bytes_per_element"]
    return arch if width == arch.cache_dtype_bytes else arch.with_cache_dtype(width)


def chart_contexts(context: int) -> list[int]:
    """Powers of two up to twice the selected length, plus the selected length itself."""
    top = max(1, math.ceil(math.log2(context)) + 1)
    bottom = max(0, top - CHART_POINTS + 1)
    points = {2**k for k in range(bottom, top + 1)} | {context}
    return sorted(points)


def _budget_error(values: dict[str, Any], arch: ArchSpec) -> dict[str, str]:
    """Weights and reserve that leave no KV pool, said beside the field that decides it."""
    memory = gib_to_bytes(values["device_memory_gib"])
    given_weights = values["weights_gib"] is not None
    weights = gib_to_bytes(values["weights_gib"]) if given_weights else arch.weight_bytes
    reserve = gib_to_bytes(values["reserve_gib"]) if values["reserve_gib"] is not None else 0
    if weights + reserve < memory:
        return {}
    whose = "the given weights" if given_weights else f"the weights of {arch.name}"
    text = (
        f"{whose} ({fmt_bytes(weights)}) plus the reserve ({fmt_bytes(reserve)}) leave no room "
        f"for a KV cache in {fmt_bytes(memory)} of device memory"
    )
    if given_weights and weights >= memory:
        return {"weights_gib": text}
    if weights >= memory:
        return {"device_memory_gib": text}
    return {"reserve_gib": text}


def run_plan(values: dict[str, Any], arch: ArchSpec) -> dict[str, Any]:
    """`build_plan` for the form's inputs, at the chart's lengths (the selected one included)."""
    device = replace(
        get_device(RATES_DEVICE),
        name="lab device",
        memory_bytes=gib_to_bytes(values["device_memory_gib"]),
        source=f"memory from the lab's form; compute rates of {RATES_DEVICE} (not shown)",
    )
    return build_plan(
        arch,
        chart_contexts(values["context"]),
        device=device,
        concurrency=values["concurrency"],
        page_size=values["page_size"],
        shared_prefix=values["shared_prefix"],
        weights_bytes=(
            gib_to_bytes(values["weights_gib"]) if values["weights_gib"] is not None else None
        ),
        reserve_bytes=(
            gib_to_bytes(values["reserve_gib"]) if values["reserve_gib"] is not None else None
        ),
    )


def _figure(key: str, title: str, layer: str, value: int, denominator: str) -> dict[str, Any]:
    return {
        "key": key,
        "title": title,
        "layer": layer,
        "bytes": value,
        "unit": "bytes",
        "text": fmt_bytes(value),
        "exact": f"{value:,} bytes",
        "denominator": denominator,
    }


def four_figures(plan: dict[str, Any], context: int) -> dict[str, dict[str, Any]]:
    """The lab's four outputs, read from the plan's row for `context`, never recomputed."""
    row = plan["per_context"][plan["contexts"].index(context)]
    mem = plan["sections"]["memory"]["summary"]
    inputs = plan["inputs"]
    n, page, prefix = inputs["concurrency"], inputs["page_size"], inputs["shared_prefix_tokens"]
    reqs = f"{n:,} request{'s' if n != 1 else ''}"
    per_token = plan["kv_bytes_per_token"]
    fixed = mem["fixed_state_bytes_per_request"]
    if per_token == 0 and fixed > 0:
        logical = _figure(
            "logical",
            "1 · logical fixed state (no per-token cost)",
            plan["sections"]["memory"]["layer"],
            row["kv_bytes_for_concurrency"],
            f"bytes of fixed recurrent state held by {reqs}, whatever the context length; "
            "a token adds nothing",
        )
    else:
        growing = sum(
            count
            for label, count in plan["arch"]["layer_kinds"].items()
            if label.split("(")[0] in ("full", "sliding", "mla")
        )
        extra = f"; plus {fmt_bytes(fixed)} of fixed state per request" if fixed else ""
        logical = _figure(
            "logical",
            "1 · logical bytes per token",
            plan["sections"]["memory"]["layer"],
            per_token,
            f"bytes per retained token, summed over {growing:,} token-growing layers, before "
            f"any paging{extra}",
        )
    physical = _figure(
        "physical",
        "2 · total physical modeled state",
        plan["sections"]["paging"]["layer"],
        row["allocated_bytes_for_concurrency"],
        f"bytes held by {reqs} of {context:,} tokens each, after rounding to {page:,}-token pages",
    )
    shared = row["prefix_tokens_shared"]
    prefix_avoided = _figure(
        "prefix_avoided",
        "3 · prefix bytes avoided",
        plan["sections"]["sharing"]["layer"],
        row["bytes_avoided_by_sharing"],
        (
            f"bytes not stored when {reqs} share one copy of a {shared:,}-token prefix "
            "(ideal exact-prefix sharing)"
            if prefix
            else "bytes not stored by prefix sharing: no shared prefix is set"
        ),
    )
    waste = _figure(
        "page_waste",
        "4 · page-rounding waste",
        plan["sections"]["paging"]["layer"],
        row["wasted_bytes_per_request"],
        f"bytes per request of {context:,} tokens: {row['wasted_tokens_per_request']:,} unused "
        f"slot(s) of the last {page:,}-token page, over all paged layers",
    )
    return {f["key"]: f for f in (logical, physical, prefix_avoided, waste)}


def _shown_inputs(values: dict[str, Any]) -> dict[str, Any]:
    """The inputs that shape this answer (raw-architecture fields only in raw mode)."""
    raw = values["arch"] == "raw"
    return {
        f.name: values[f.name]
        for f in FIELDS
        if (raw or not f.raw_only) and not (raw and f.name == "preset")
    }


def plan_response(data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) for one form submission; a user mistake is a 400 naming it."""
    try:
        values = parse_form(data, preset_names())
        arch = lab_arch(values)
        budget_errors = _budget_error(values, arch)
        if budget_errors:
            raise FormError(budget_errors)
        plan = run_plan(values, arch)
    except FormError as exc:
        field = next(iter(exc.errors))
        return HTTPStatus.BAD_REQUEST, {
            "error": str(exc),
            "field": field,
            "errors": exc.errors,
        }
    except CtxlabError as exc:
        return HTTPStatus.BAD_REQUEST, {"error": str(exc), "field": None, "errors": {}}
    context = values["context"]
    row = plan["per_context"][plan["contexts"].index(context)]
    cap = plan["sections"]["capacity"]
    fits = row["concurrency_fits"]
    n = values["concurrency"]
    kinds = ", ".join(f"{label} x{count}" for label, count in plan["arch"]["layer_kinds"].items())
    return HTTPStatus.OK, {
        "arch": {
            "name": plan["arch"]["name"],
            "source": plan["arch"]["source"],
            "summary": f"{plan['arch']['n_layers']} layers ({kinds}), "
            f"{plan['arch']['cache_dtype_bytes']:g} bytes per element",
        },
        "inputs": _shown_inputs(values),
        "layers": {name: f.layer for name, f in FIELDS_BY_NAME.items()},
        "figures": four_figures(plan, context),
        "capacity": {
            "sentence": row["capacity_sentence"],
            "max_concurrent_requests": row["max_concurrent_requests"],
            "concurrency_fits": fits,
            "concurrency_sentence": (
                f"The chosen concurrency of {n:,} {'fits' if fits else 'does not fit'}."
            ),
            "kv_budget_bytes": cap["summary"]["kv_budget_bytes"],
            "weights_bytes": cap["summary"]["weights_bytes"],
            "reserve_bytes": cap["summary"]["reserve_bytes"],
        },
        "chart": {
            "context": context,
            "concurrency": n,
            "budget_bytes": cap["summary"]["kv_budget_bytes"],
            "points": [
                {
                    "context": r["context_tokens"],
                    "logical_bytes": r["kv_bytes_for_concurrency"],
                    "physical_bytes": r["allocated_bytes_for_concurrency"],
                }
                for r in plan["per_context"]
            ],
        },
        "plan_row": row,
        "notes": plan["notes"],
    }
