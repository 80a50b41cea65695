"""The registered demonstrations, and the workshop config schema they make.

Adding a demonstration is one module that builds a `Demonstration` plus one line in
`REGISTERED`; the config schema (one table per demonstration), the embedded default config,
the names a prediction or a required metric may use, `--only`, the run order and the "what
could go wrong" list all follow from this tuple. Nothing here imports torch.
"""

from __future__ import annotations

from pydantic import BaseModel, create_model, field_validator, model_validator

from ctxlab.workshop import (
    demo_compaction,
    demo_disagg,
    demo_eviction,
    demo_followup,
    demo_long_vs_retrieval,
    demo_offload,
    demo_page_size,
    demo_prefix_miss,
    demo_recurrent,
    demo_retrieval_depth,
    demo_warm_prefix,
)
from ctxlab.workshop.config import CommonConfig, Prediction
from ctxlab.workshop.demonstration import Demonstration, Metric

REGISTERED: tuple[Demonstration[BaseModel], ...] = (
    demo_prefix_miss.DEMO,
    demo_warm_prefix.DEMO,
    demo_page_size.DEMO,
    demo_eviction.DEMO,
    demo_compaction.DEMO,
    demo_retrieval_depth.DEMO,
    demo_recurrent.DEMO,
    demo_offload.DEMO,
    demo_disagg.DEMO,
    demo_followup.DEMO,
    demo_long_vs_retrieval.DEMO,
)

BY_KEY: dict[str, Demonstration[BaseModel]] = {d.key: d for d in REGISTERED}
BY_NUMBER: dict[int, Demonstration[BaseModel]] = {d.number: d for d in REGISTERED}


def metric_ref(ref: str) -> tuple[Demonstration[BaseModel], Metric] | str:
    """`"demo.metric"` -> (demo, metric), or why it names nothing (a sentence fragment)."""
    key, dot, name = ref.partition(".")
    if not dot:
        return f"{ref!r} is not of the form demonstration.metric"
    demo = BY_KEY.get(key)
    if demo is None:
        return f"{key!r} is not a demonstration (known: {', '.join(BY_KEY)})"
    metric = demo.metric(name)
    if metric is None:
        return f"{name!r} is not a metric of {key} (known: {', '.join(demo.metric_names)})"
    return demo, metric


class _Checked(CommonConfig):
    """The checks that need the registry: metric names and each demonstration's own."""

    @field_validator("required_metrics")
    @classmethod
    def _required(cls, refs: list[str]) -> list[str]:
        for ref in refs:
            found = metric_ref(ref)
            if isinstance(found, str):
                raise ValueError(found)
        return refs

    @field_validator("predictions")
    @classmethod
    def _predictions(
        cls, table: dict[str, dict[str, Prediction]]
    ) -> dict[str, dict[str, Prediction]]:
        for key, metrics in table.items():
            if key not in BY_KEY:
                raise ValueError(f"{key!r} is not a demonstration (known: {', '.join(BY_KEY)})")
            for name in metrics:
                if isinstance(metric_ref(f"{key}.{name}"), str):
                    known = ", ".join(BY_KEY[key].metric_names)
                    raise ValueError(
                        f"[predictions.{key}] names {name!r}, not a metric of {key} "
                        f"(known: {known})"
                    )
        return table

    @model_validator(mode="after")
    def _each_demonstration(self) -> _Checked:
        for demo in REGISTERED:
            if demo.check is not None:
                demo.check(demo.config(self), self)
        return self


def _check_unique() -> None:
    numbers = [d.number for d in REGISTERED]
    if numbers != list(range(1, len(REGISTERED) + 1)) or len(BY_KEY) != len(REGISTERED):
        raise RuntimeError(f"demonstrations must be numbered 1..n with distinct keys: {numbers}")


_check_unique()

# The whole contract: the shared tables plus one table per registered demonstration.
WorkshopConfig: type[_Checked] = create_model(  # type: ignore[call-overload]
    "WorkshopConfig",
    __base__=_Checked,
    **{d.key: (d.section, ...) for d in REGISTERED},
)
