"""The lab's form: every input field, its stack layer, its limits, and its validation.

The browser sends raw strings; this module is the one place that turns them into numbers and
rejects what makes no sense (non-numbers, zero where a size is needed, absurd sizes), naming
the field so the page can put the message beside it. Each field also says which layer of the
stack it belongs to, so the page can tell a page-size change (allocation) from a cheaper
token (representation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from ctxlab.arch.limits import MAX_DIM, MAX_HEADS, MAX_LAYERS, MAX_TOKENS, check_heads
from ctxlab.errors import CtxlabError

GIB = 1024**3

FieldKind = Literal["int", "float", "choice"]

# Layers a field can move: the three stack layers the lab shows, plus the workload (context,
# concurrency) that scales every figure, and the device (which only moves the capacity line).
REPRESENTATION = "representation"
ALLOCATION = "allocation"
SHARING = "sharing"
WORKLOAD = "workload"
DEVICE = "device"

ARCH_MODES = ("preset", "raw")
RECURRENT_KINDS = ("mamba", "linear", "kda")
BYTES_PER_ELEMENT = (0.5, 1.0, 2.0, 4.0)

MAX_GIB = 1024.0 * 1024.0  # one PiB of device memory


@dataclass(frozen=True)
class Field:
    """One input: how to read it, its bounds, and the stack layer a change to it moves."""

    name: str
    label: str
    layer: str
    kind: FieldKind = "int"
    minimum: float = 0
    maximum: float = MAX_TOKENS
    default: Any = None
    allow_zero: bool = False
    raw_only: bool = False  # only read when the architecture is given by raw fields
    choices: tuple[Any, ...] = ()
    unit: str = ""


FIELDS: tuple[Field, ...] = (
    # -- representation: which model, and how wide one cached element is
    Field(
        "arch",
        "architecture source",
        REPRESENTATION,
        "choice",
        choices=ARCH_MODES,
        default="preset",
    ),
    Field("preset", "preset", REPRESENTATION, "choice", default="llama-3.1-8b"),
    Field(
        "bytes_per_element",
        "bytes per element",
        REPRESENTATION,
        "choice",
        choices=BYTES_PER_ELEMENT,
        default=2.0,
        unit="B",
    ),
    Field(
        "full_layers",
        "full-attention layers",
        REPRESENTATION,
        maximum=MAX_LAYERS,
        allow_zero=True,
        raw_only=True,
        default=32,
    ),
    Field(
        "sliding_layers",
        "sliding-window layers",
        REPRESENTATION,
        maximum=MAX_LAYERS,
        allow_zero=True,
        raw_only=True,
        default=0,
    ),
    Field(
        "mla_layers",
        "MLA layers",
        REPRESENTATION,
        maximum=MAX_LAYERS,
        allow_zero=True,
        raw_only=True,
        default=0,
    ),
    Field(
        "recurrent_layers",
        "recurrent layers",
        REPRESENTATION,
        maximum=MAX_LAYERS,
        allow_zero=True,
        raw_only=True,
        default=0,
    ),
    Field(
        "none_layers",
        "layers without cache",
        REPRESENTATION,
        maximum=MAX_LAYERS,
        allow_zero=True,
        raw_only=True,
        default=0,
    ),
    Field(
        "query_heads", "query heads", REPRESENTATION, maximum=MAX_HEADS, raw_only=True, default=32
    ),
    Field("kv_heads", "KV heads", REPRESENTATION, maximum=MAX_HEADS, raw_only=True, default=8),
    Field("d_k", "d_k (key head dim)", REPRESENTATION, maximum=MAX_DIM, raw_only=True, default=128),
    Field(
        "d_v", "d_v (value head dim)", REPRESENTATION, maximum=MAX_DIM, raw_only=True, default=128
    ),
    Field(
        "mla_d_c",
        "MLA latent width d_c",
        REPRESENTATION,
        maximum=MAX_DIM,
        raw_only=True,
        default=512,
    ),
    Field(
        "mla_d_rope",
        "MLA rope width d_R",
        REPRESENTATION,
        maximum=MAX_DIM,
        allow_zero=True,
        raw_only=True,
        default=64,
    ),
    Field("window", "sliding window", REPRESENTATION, raw_only=True, default=4096, unit="tokens"),
    Field(
        "recurrent_kind",
        "recurrent kind",
        REPRESENTATION,
        "choice",
        choices=RECURRENT_KINDS,
        raw_only=True,
        default="mamba",
    ),
    Field(
        "rec_d_model", "Mamba d_model", REPRESENTATION, maximum=MAX_DIM, raw_only=True, default=4096
    ),
    Field(
        "rec_d_state", "Mamba d_state", REPRESENTATION, maximum=MAX_DIM, raw_only=True, default=16
    ),
    Field("rec_d_conv", "Mamba d_conv", REPRESENTATION, maximum=MAX_DIM, raw_only=True, default=4),
    Field("rec_expand", "Mamba expand", REPRESENTATION, maximum=64, raw_only=True, default=2),
    Field(
        "rec_heads", "recurrent heads", REPRESENTATION, maximum=MAX_HEADS, raw_only=True, default=32
    ),
    Field(
        "rec_feature_dim",
        "linear-attention feature width r",
        REPRESENTATION,
        maximum=MAX_DIM,
        raw_only=True,
        default=128,
    ),
    Field(
        "rec_d_v",
        "linear-attention d_v",
        REPRESENTATION,
        maximum=MAX_DIM,
        raw_only=True,
        default=128,
    ),
    Field(
        "rec_head_dim", "KDA head dim", REPRESENTATION, maximum=MAX_DIM, raw_only=True, default=128
    ),
    # -- workload: scales every figure
    Field("context", "context length", WORKLOAD, minimum=1, default=100_000, unit="tokens"),
    Field("concurrency", "concurrency", WORKLOAD, maximum=1_000_000, default=8, unit="requests"),
    # -- allocation: how the state is laid out in pages
    Field("page_size", "page size", ALLOCATION, maximum=65_536, default=16, unit="tokens"),
    # -- sharing: what identical prefixes let requests hold once
    Field(
        "shared_prefix", "shared-prefix tokens", SHARING, allow_zero=True, default=0, unit="tokens"
    ),
    # -- device: only the capacity line moves
    Field(
        "device_memory_gib",
        "device memory",
        DEVICE,
        "float",
        maximum=MAX_GIB,
        default=80.0,
        unit="GiB",
    ),
    Field(
        "weights_gib",
        "weights",
        DEVICE,
        "float",
        maximum=MAX_GIB,
        allow_zero=True,
        default=None,
        unit="GiB",
    ),
    Field(
        "reserve_gib",
        "runtime reserve",
        DEVICE,
        "float",
        maximum=MAX_GIB,
        allow_zero=True,
        default=8.0,
        unit="GiB",
    ),
)

FIELDS_BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}


class FormError(CtxlabError):
    """One or more fields are wrong; `errors` maps each field name to one sentence."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = dict(errors)
        first_field, first_msg = next(iter(self.errors.items()))
        super().__init__(f"field {first_field!r}: {first_msg}")


def _parse_number(field: Field, raw: Any) -> float:
    """Read a number from a string or JSON number; a word, NaN or infinity is refused."""
    if isinstance(raw, bool):
        raise ValueError(f"{field.label} must be a number, got {raw!r}")
    if isinstance(raw, int) and abs(raw) > 2**53:
        raise ValueError(f"{field.label} of {raw:.3g} is absurdly large")
    if isinstance(raw, int | float):
        value = float(raw)
    else:
        text = str(raw).strip().replace(",", "").replace("_", "")
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{field.label} must be a number, got {str(raw)!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{field.label} must be a finite number, got {raw!r}")
    return value


def _read_field(field: Field, raw: Any) -> Any:
    """One field's value, or ValueError with one sentence naming the field and its limits."""
    if field.kind == "choice":
        if field.name == "bytes_per_element":
            value = _parse_number(field, raw)
        else:
            value = str(raw).strip().lower()
        if field.choices and value not in field.choices:
            shown = ", ".join(_show(c) for c in field.choices)
            raise ValueError(f"{field.label} must be one of {shown}, got {_show(raw)}")
        return value
    value = _parse_number(field, raw)
    if field.kind == "int":
        if value != int(value):
            raise ValueError(f"{field.label} must be a whole number, got {_show(raw)}")
        value = int(value)
    if value < 0 or (value == 0 and not field.allow_zero):
        need = "zero or positive" if field.allow_zero else "positive"
        raise ValueError(f"{field.label} must be {need}, got {_show(raw)}")
    if value < field.minimum:
        raise ValueError(f"{field.label} must be at least {_show(field.minimum)}")
    if value > field.maximum:
        raise ValueError(
            f"{field.label} of {_show(raw)} is absurdly large; the lab accepts up to "
            f"{_show(field.maximum)}{' ' + field.unit if field.unit else ''}"
        )
    return value


def _show(value: Any) -> str:
    if isinstance(value, float) and value == int(value):
        return f"{int(value):,}"
    if isinstance(value, int | float):
        return f"{value:,}"
    return repr(value) if isinstance(value, str) else str(value)


def _blank(raw: Any) -> bool:
    return raw is None or (isinstance(raw, str) and raw.strip() == "")


def parse_form(data: dict[str, Any], presets: tuple[str, ...]) -> dict[str, Any]:
    """Validated inputs from the page's raw values; FormError names every bad field.

    Blank fields take their default; raw-architecture fields are only read (and only
    required) when `arch` is "raw", and then only those the chosen layer kinds need.
    """
    unknown = sorted(set(data) - set(FIELDS_BY_NAME))
    errors: dict[str, str] = {
        name: f"unknown field {name!r}; the lab does not read it" for name in unknown
    }
    values: dict[str, Any] = {}
    for field in FIELDS:
        raw = data.get(field.name)
        if _blank(raw):
            values[field.name] = field.default
            continue
        try:
            values[field.name] = _read_field(field, raw)
        except ValueError as exc:
            errors[field.name] = str(exc)
    if (
        "preset" not in errors
        and values.get("arch") == "preset"
        and values["preset"] not in presets
    ):
        errors["preset"] = (
            f"unknown preset {values['preset']!r}; known presets: {', '.join(presets)}"
        )
    if values.get("arch") == "raw":
        errors.update(_raw_arch_errors(values, errors))
    else:
        for field in FIELDS:
            if field.raw_only:
                errors.pop(field.name, None)
    errors.update(_workload_errors(values, errors))
    if errors:
        raise FormError(errors)
    return values


def _raw_arch_errors(values: dict[str, Any], errors: dict[str, str]) -> dict[str, str]:
    """Cross-field rules of a raw architecture: the fields its layer kinds need."""
    out: dict[str, str] = {}
    counts = {k: values.get(f"{k}_layers") for k in ("full", "sliding", "mla", "recurrent")}
    counts["none"] = values.get("none_layers")
    if all(isinstance(c, int) for c in counts.values()) and sum(counts.values()) == 0:
        out["full_layers"] = "the architecture needs at least one layer of some kind"
    needed: list[str] = []
    if (counts["full"] or 0) + (counts["sliding"] or 0) > 0:
        needed += ["kv_heads", "d_k", "d_v"]
    if (counts["sliding"] or 0) > 0:
        needed.append("window")
    if (counts["mla"] or 0) > 0:
        needed.append("mla_d_c")
    if (counts["recurrent"] or 0) > 0:
        kind = values.get("recurrent_kind")
        needed += {
            "mamba": ["rec_d_model", "rec_d_state", "rec_d_conv", "rec_expand"],
            "linear": ["rec_heads", "rec_feature_dim", "rec_d_v"],
            "kda": ["rec_heads", "rec_head_dim"],
        }.get(kind, [])
    for name in needed:
        if name not in errors and values.get(name) is None:
            out[name] = f"{FIELDS_BY_NAME[name].label} is needed by the chosen layers"
    q, kv = values.get("query_heads"), values.get("kv_heads")
    if "kv_heads" in needed and isinstance(q, int) and isinstance(kv, int):
        try:
            check_heads(q, kv, "the architecture")
        except CtxlabError as exc:
            out["kv_heads"] = str(exc)
    return out


def _workload_errors(values: dict[str, Any], errors: dict[str, str]) -> dict[str, str]:
    """Cross-field rules of the workload and the device."""
    out: dict[str, str] = {}
    ctx, prefix = values.get("context"), values.get("shared_prefix")
    if "context" not in errors and "shared_prefix" not in errors and prefix > ctx:
        out["shared_prefix"] = (
            f"shared-prefix tokens ({prefix:,}) cannot exceed the context length ({ctx:,})"
        )
    return out


def gib_to_bytes(gib: float) -> int:
    """GiB as typed in the form to exact integer bytes (binary: 1 GiB = 1,073,741,824 B)."""
    return round(gib * GIB)


def field_table() -> list[dict[str, Any]]:
    """The form's schema for the page: names, labels, layers, units and defaults."""
    return [
        {
            "name": f.name,
            "label": f.label,
            "layer": f.layer,
            "unit": f.unit,
            "default": f.default,
            "raw_only": f.raw_only,
            "choices": list(f.choices),
        }
        for f in FIELDS
    ]
