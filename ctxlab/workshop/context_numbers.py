"""The six context numbers, kept apart: six different things often all called "context".

advertised window (what the model file says), configured maximum length (what this run's
engine accepts), prompt budget (that minus the output reserved), resident cache tokens (what
the pool really held for one request), retrieved tokens (what retrieval put in the prompt:
declared by the demonstration that measures it, `Demonstration.context_numbers`), measured
useful context (how far the model still does the tasks). Each comes with where it
was read or measured, or why this run has no value for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxlab.workshop.result import JSONObject, fmt

if TYPE_CHECKING:
    from ctxlab.workshop.session import Session


def context_numbers(
    session: Session, demos: dict[str, JSONObject], useful: JSONObject | None
) -> list[JSONObject]:
    cfg = session.cfg
    advertised = int(getattr(session.loaded.config, "max_position", 0)) or None
    rows: list[JSONObject] = [
        {
            "name": "advertised window",
            "tokens": advertised,
            "source": "the model file's metadata (trained context length)",
        },
        {
            "name": "configured maximum length",
            "tokens": cfg.model.max_model_len,
            "source": "model.max_model_len: the engine's limit on prompt plus output in this run",
        },
        {
            "name": "prompt budget after reserved output",
            "tokens": cfg.model.max_model_len - cfg.model.reserved_output_tokens,
            "source": f"configured maximum minus {fmt(cfg.model.reserved_output_tokens)} output "
            "tokens reserved (model.reserved_output_tokens)",
        },
    ]
    if session.resident_tokens:
        where, tokens = max(session.resident_tokens, key=lambda x: x[1])
        rows.append(
            {
                "name": "resident cache tokens",
                "tokens": tokens,
                "source": "the most token slots one request held, measured from the pool "
                f"({where})",
            }
        )
    else:
        rows.append(
            {
                "name": "resident cache tokens",
                "tokens": None,
                "source": "not measured: no engine demonstration ran",
            }
        )
    rows += _declared(demos)
    if useful is None:
        rows.append(
            {
                "name": "measured useful context",
                "tokens": None,
                "source": "not measured: the eval is off in this run "
                "(useful_context.enabled = false; --quick turns it off)",
            }
        )
    else:
        eff = useful["effective_length"]
        tested = sorted(int(n) for n in useful["mean_by_length"])
        tasks = ", ".join(sorted({r["task"] for r in useful["rows"]}))
        source = (
            f"effective length of the eval below at threshold {fmt(useful['threshold'], 1)}, "
            f"on {tasks} only (RULER averages all its tasks: `ctxlab eval --suite standard`)"
        )
        if eff is None:
            source += f": no tested length reached it, so it is below {fmt(tested[0])} tokens"
        elif eff == tested[-1]:
            source += ": the longest tested length passed, so the model may do more; "
            source += "only this much is measured"
        rows.append({"name": "measured useful context", "tokens": eff, "source": source})
    return rows


def _declared(demos: dict[str, JSONObject]) -> list[JSONObject]:
    """The context numbers demonstrations measure (`Demonstration.context_numbers`), read
    from their figures; one that did not run says so."""
    from ctxlab.workshop.registry import REGISTERED

    rows: list[JSONObject] = []
    for demo in REGISTERED:
        got = demos.get(demo.key, {})
        for c in demo.context_numbers:
            tokens = got.get("figures", {}).get(c.figure)
            rows.append(
                {
                    "name": c.name,
                    "tokens": tokens,
                    "source": f"{c.source} (demonstration {demo.number})"
                    if tokens is not None
                    else f"not measured: demonstration {demo.number} "
                    f"{got.get('status', 'did not run')}",
                }
            )
    return rows
