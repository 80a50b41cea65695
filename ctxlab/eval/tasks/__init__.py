"""The task registry: RULER-style names mapped to configured generators."""

from __future__ import annotations

from typing import Protocol

from ctxlab.errors import CtxlabError
from ctxlab.eval.sample import Draft, Metric
from ctxlab.eval.tasks.aggregation import CommonWordsTask, FrequentWordsTask
from ctxlab.eval.tasks.niah import NeedleTask
from ctxlab.eval.tasks.qa import DocumentQATask
from ctxlab.eval.tasks.variable_tracking import VariableTrackingTask


class Task(Protocol):
    name: str
    metric: Metric
    max_new_tokens: int

    def draft(self, n_units: int, depth: float | None, seed: int) -> Draft: ...


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        NeedleTask("niah_single_noise", haystack="noise", value_kind="numbers"),
        NeedleTask("niah_single_essay", haystack="essay", value_kind="numbers"),
        NeedleTask("niah_single_uuid", haystack="essay", value_kind="uuids", max_new_tokens=64),
        NeedleTask("niah_multikey", haystack="essay", num_keys=4),
        NeedleTask("niah_multikey_needles", haystack="needle", num_keys=4),
        NeedleTask("niah_multivalue", haystack="essay", num_values=4, max_new_tokens=64),
        NeedleTask(
            "niah_multiquery", haystack="essay", num_keys=4, num_queries=4, max_new_tokens=64
        ),
        VariableTrackingTask(),
        CommonWordsTask(),
        FrequentWordsTask(),
        DocumentQATask(),
    )
}

# Tasks with a needle (or gold document) at a controllable depth: the length x depth grid.
DEPTH_TASKS = tuple(name for name in TASKS if name.startswith(("niah", "qa")))


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise CtxlabError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[name]
