"""What could go wrong in a long-context decision, checked item by item against this run.

Each item (`demonstration.Risk`) is a known way to fool oneself. A demonstration that guards
against one declares it (`Demonstration.guards`) and cites its own figures; the few guarded
by the report's structure itself are here. An item no selected demonstration guarded says
which demonstration would have and what became of it, so a run that skipped a demonstration
cannot claim its guard.
"""

from __future__ import annotations

from collections.abc import Callable

from ctxlab.workshop.demonstration import Risk
from ctxlab.workshop.registry import REGISTERED
from ctxlab.workshop.result import JSONObject, fmt

Results = JSONObject
Check = Callable[[Results], tuple[str, str]]


def _useful(res: Results) -> tuple[str, str]:
    nums = {r["name"]: r["tokens"] for r in res["context_numbers"]}
    configured = fmt(nums["configured maximum length"])
    if res.get("useful_context") is None:
        return "partly guarded", (
            f"the configured maximum ({configured} tokens) is its own row of the context "
            "numbers, but this run did not measure useful context (the eval is off)"
        )
    eff = nums["measured useful context"]
    said = f"{fmt(eff)} tokens" if eff is not None else "below the shortest tested length"
    return "guarded", (
        f"the configured maximum ({configured} tokens) and the measured useful context "
        f"({said}, from the eval's effective length) are separate rows of the context numbers"
    )


def _ratios(res: Results) -> tuple[str, str]:
    return "guarded", (
        "storage tables carry no quality column and the report draws no quality conclusion "
        "from bytes; the task table is measured separately and names its own layer"
    )


def _p99(res: Results) -> tuple[str, str]:
    return "guarded", (
        "every latency is reported as percentiles (p50, p95, p99) or a median with its minimum "
        "and maximum, never as a mean alone"
    )


# Guarded by the report's own structure, whatever ran; a demonstration's guard adds to these.
STRUCTURAL: dict[Risk, Check] = {
    Risk.USEFUL_CONTEXT: _useful,
    Risk.STORAGE_RATIOS: _ratios,
    Risk.P99: _p99,
}


def _item(res: Results, risk: Risk) -> tuple[str, str]:
    found: list[tuple[str, str]] = []
    if risk in STRUCTURAL:
        found.append(STRUCTURAL[risk](res))
    missing = []
    for demo in REGISTERED:
        for guarded, guard in demo.guards:
            if guarded is not risk:
                continue
            ran = res["demos"].get(demo.key)
            if isinstance(ran, dict) and ran.get("status") == "run":
                figures = ran["figures"]
                assert isinstance(figures, dict)
                found.append(guard(figures))
            else:
                status = ran.get("status") if isinstance(ran, dict) else "not selected"
                missing.append(f"demonstration {demo.number} was {status}")
    if found:
        status = "guarded" if all(s == "guarded" for s, _ in found) else "partly guarded"
        return status, "; ".join(how for _, how in found)
    if missing:
        return "not exercised", "not exercised: " + "; ".join(missing)
    return "not exercised", "no demonstration in this build guards against it"


def evaluate(res: Results) -> list[dict[str, str]]:
    """Every risk, in the list's order: its status and how this run guards against it."""
    out = []
    for risk in Risk:
        status, how = _item(res, risk)
        out.append({"risk": risk.value, "status": status, "how": how})
    return out
