"""`--sweep PARAM=v1,v2,...`: one parameter varied, everything else fixed, one row per value."""

from __future__ import annotations

from collections.abc import Callable

from ctxlab.errors import CtxlabError
from ctxlab.plan.units import parse_bytes
from ctxlab.sim.config import SimConfig

# sweep name -> (SimConfig field, parser)
SWEEPABLE: dict[str, tuple[str, Callable[[str], object]]] = {
    "pool-bytes": ("pool_bytes", lambda v: parse_bytes(v, "pool size")),
    "page-size": ("page_size", int),
    "chunk-tokens": ("chunk_tokens", int),
    "offload-bytes": ("offload_bytes", lambda v: parse_bytes(v, "offload tier size")),
    "step-scale": ("step_scale", float),
    "trace-time-scale": ("time_scale", float),  # the offered rate: see ctxlab.sim.slo
}


def parse_sweep(text: str) -> tuple[str, list[tuple[str, object]]]:
    """'page-size=16,32' -> ('page-size', [('16', 16), ('32', 32)])."""
    name, eq, values = text.partition("=")
    name = name.strip().lstrip("-")
    if not eq or name not in SWEEPABLE:
        raise CtxlabError(
            f"--sweep needs PARAM=v1,v2,... with PARAM one of {', '.join(SWEEPABLE)}, got {text!r}"
        )
    parse = SWEEPABLE[name][1]
    out = []
    for raw in filter(None, (v.strip() for v in values.split(","))):
        try:
            out.append((raw, parse(raw)))
        except ValueError:
            raise CtxlabError(f"--sweep {name} value {raw!r} is not a number") from None
    if len(out) < 2:
        raise CtxlabError(f"--sweep {name} needs at least two values")
    return name, out


def sweep_configs(base: SimConfig, name: str, values: list[tuple[str, object]]):
    field = SWEEPABLE[name][0]
    for label, value in values:
        changes: dict[str, object] = {field: value}
        if field == "pool_bytes":
            changes["unlimited"] = False
        yield label, base.with_(**changes)
