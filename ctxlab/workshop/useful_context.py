"""Measured useful context: a small RULER-style eval on the real engine, its effective length.

The configured maximum length says what the engine accepts; the effective length says how
far the model still does the tasks (the longest tested length at which it, and every shorter
one, scores at or above the threshold; `ctxlab.eval.scoring`). This runs the eval's own
grid, backend and scoring with the full cache, so the figure is the eval's, not a new one.
"""

from __future__ import annotations

from ctxlab.progress import Tracker
from ctxlab.workshop.measure import Timer
from ctxlab.workshop.result import Column, JSONObject, Table
from ctxlab.workshop.session import Session


def steps(session: Session) -> int:
    u = session.cfg.useful_context
    return len(u.tasks) * len(u.lengths) * u.samples


def measure(session: Session, tracker: Tracker) -> JSONObject:
    """Scores per task and length, the mean per length, and the effective length."""
    from ctxlab.eval.engine_backend import EngineBackend, token_counter
    from ctxlab.eval.runner import Grid, PolicyRun, run_grid
    from ctxlab.eval.summary import effective_lengths, length_means

    u = session.cfg.useful_context
    grid = Grid(
        tasks=u.tasks,
        lengths=u.lengths,
        depths=[0.5],
        samples=u.samples,
        seed=session.cfg.model.seed,
        runs=[PolicyRun()],
    )
    count = token_counter(session.loaded.tokenizer)
    rows_path = session.out / "useful_context_rows.jsonl"
    rows_path.unlink(missing_ok=True)
    pool = max(u.lengths) * 2 + 1024

    def backend_for(run: PolicyRun) -> EngineBackend:
        return EngineBackend(session.loaded, run, kv_pool_tokens=pool)

    with Timer() as t:
        rows = run_grid(
            grid,
            count,
            backend_for,
            rows_path,
            session.cfg.model.source,
            on_progress=tracker.advance,
            batch_size=2,
        )
    means = length_means(rows)["full"]
    eff = effective_lengths(rows, u.threshold)["full"]
    return {
        "rows": [{k: r[k] for k in ("task", "length", "score", "prompt_tokens")} for r in rows],
        "mean_by_length": {str(n): m.score for n, m in means.items()},
        "effective_length": eff.length,
        "threshold": u.threshold,
        "explanation": eff.explanation,
        "rows_file": rows_path.name,
        "wall_s": round(t.wall_s, 1),
    }


def table(result: JSONObject) -> Table:
    t = Table(
        "useful_context_task",
        "task",
        "Measured useful context: scores with the full cache (string match, percent)",
        "measured",
        [Column("task"), Column("length"), Column("prompt tokens"), Column("score", 1)],
        note="needles at mid-depth; the effective length is the longest length whose mean over "
        "tasks, and every shorter one's, reaches the threshold",
    )
    for r in result["rows"]:
        t.add(r["task"], r["length"], r["prompt_tokens"], float(r["score"]))
    return t
