"""Named grids, so "the quick suite" means the same thing on every machine.

quick: a few minutes per policy on 2 CPU cores with the default model, enough to see a
policy lose a needle. standard: every task at 512-2,048 tokens, one needle depth (50 %),
one sample: ~5 minutes per policy on one such core, so full against every policy at two
budgets fits an afternoon. ruler: every task, four lengths, RULER's 11 depths, 2 samples;
hours per policy on a CPU, meant for a bigger machine or a remote backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxlab.errors import CtxlabError
from ctxlab.eval.tasks import TASKS


@dataclass(frozen=True)
class Suite:
    tasks: tuple[str, ...]
    lengths: tuple[int, ...]
    depths: int
    samples: int


SUITES: dict[str, Suite] = {
    "quick": Suite(("niah_single_noise", "niah_multikey", "vt", "qa"), (512, 1024), 3, 1),
    "standard": Suite(tuple(TASKS), (512, 1024, 2048), 1, 1),
    "ruler": Suite(tuple(TASKS), (512, 1024, 2048, 4096), 11, 2),
}


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise CtxlabError(f"unknown suite {name!r}; known suites: {', '.join(SUITES)}")
    return SUITES[name]


def parse_policy_runs(spec: str, budget: str | None) -> list[tuple[str, str | None]]:
    """ "full,snapkv@128,h2o" with a default budget -> [(policy, budget or None)].

    `full` never takes a budget; every other policy takes its own `@budget` or the default.
    Every policy is checked here (name, budget), before anything runs.
    """
    from ctxlab.policy import make_policy, policy_names

    runs = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, _, own = item.partition("@")
        if name not in policy_names():
            raise CtxlabError(
                f"policy {name!r} is unknown; choose one of {', '.join(policy_names())} "
                "(ctxlab policies describes them)"
            )
        chosen = own or budget
        if name == "full":
            chosen = None
        elif chosen is None:
            raise CtxlabError(f"policy {name!r} needs a budget: add --budget N or write {name}@N")
        runs.append((name, chosen))
        # Build each policy once now, so a bad name or budget stops the run before the first
        # sample rather than after an hour of the policies listed before it.
        make_policy(name, chosen)
    if not runs:
        raise CtxlabError("--policy names no policy; e.g. --policy full,snapkv")
    return runs
