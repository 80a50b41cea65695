"""An architecture typed into the lab's form, field by field, as an `ArchSpec`.

The planner takes an `ArchSpec`; presets and config readers build one from published numbers,
and this module builds one from the lab's raw fields (layer counts by kind, head shapes, MLA
widths, window, recurrent state), so a what-if model goes through the same arithmetic as a
published one. Layer order does not change any byte count, so layers are grouped by kind.
"""

from __future__ import annotations

from typing import Any

from ctxlab.arch.spec import ArchSpec, LayerSpec, RecurrentState


def _recurrent_state(values: dict[str, Any]) -> RecurrentState:
    kind = values["recurrent_kind"]
    if kind == "mamba":
        return RecurrentState(
            "mamba",
            d_model=values["rec_d_model"],
            d_state=values["rec_d_state"],
            d_conv=values["rec_d_conv"],
            expand=values["rec_expand"],
        )
    if kind == "linear":
        return RecurrentState(
            "linear",
            heads=values["rec_heads"],
            feature_dim=values["rec_feature_dim"],
            d_v=values["rec_d_v"],
        )
    return RecurrentState("kda", heads=values["rec_heads"], head_dim=values["rec_head_dim"])


def arch_from_fields(values: dict[str, Any]) -> ArchSpec:
    """The `ArchSpec` the raw fields describe (values already validated by `parse_form`).

    It has no parameter count (weights come from the weights field), and its query heads
    default to the KV heads when not given.
    """
    layers: list[LayerSpec] = []
    kv, d_k, d_v = values["kv_heads"], values["d_k"], values["d_v"]
    layers += [LayerSpec("full", kv_heads=kv, d_k=d_k, d_v=d_v)] * values["full_layers"]
    layers += [
        LayerSpec("sliding", kv_heads=kv, d_k=d_k, d_v=d_v, window=values["window"])
    ] * values["sliding_layers"]
    if values["mla_layers"]:
        mla = LayerSpec("mla", d_c=values["mla_d_c"], d_rope=values["mla_d_rope"] or 0)
        layers += [mla] * values["mla_layers"]
    if values["recurrent_layers"]:
        rec = LayerSpec("recurrent", recurrent=_recurrent_state(values))
        layers += [rec] * values["recurrent_layers"]
    layers += [LayerSpec("none")] * values["none_layers"]
    query_heads = values.get("query_heads") or kv or 1
    head_dim = d_k or 0
    return ArchSpec(
        name="custom (raw fields)",
        layers=tuple(layers),
        n_query_heads=query_heads,
        hidden_size=query_heads * head_dim,
        params=0,
        cache_dtype_bytes=values["bytes_per_element"],
        source="typed into the lab's form",
    )
