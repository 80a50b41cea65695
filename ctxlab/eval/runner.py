"""Run a task x length x depth grid for each policy and write one JSON row per sample.

The runner is backend-agnostic: the ctxlab engine (which measures resident KV bytes from its
pool) and any OpenAI-compatible server implement the same `generate`. Samples are generated
once per (task, length, depth, sample index) from the seed, so every policy answers exactly the
same prompts and score differences are the policy's, not the data's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ctxlab.eval.fit import make_sample
from ctxlab.eval.openai_backend import Generation
from ctxlab.eval.sample import TaskSample, TokenCounter
from ctxlab.eval.scoring import string_match
from ctxlab.eval.tasks import DEPTH_TASKS, get_task


class GenerationBackend(Protocol):
    name: str

    def generate(self, samples: list[TaskSample]) -> list[Generation]: ...


@dataclass(frozen=True)
class PolicyRun:
    """One column of the comparison: a policy with its budget and position mode."""

    policy: str = "full"
    budget: int | float | None = None
    position_mode: str = "original"


@dataclass
class Grid:
    tasks: Sequence[str]
    lengths: Sequence[int]
    depths: Sequence[float]
    samples: int = 1
    seed: int = 0
    runs: Sequence[PolicyRun] = field(default_factory=lambda: [PolicyRun()])

    def cells(self) -> Iterator[tuple[str, int, float | None, int]]:
        for task in self.tasks:
            for length in self.lengths:
                depths: Sequence[float | None] = self.depths if task in DEPTH_TASKS else [None]
                for depth in depths:
                    for index in range(self.samples):
                        yield task, length, depth, self.seed + index

    def size(self) -> int:
        return sum(1 for _ in self.cells()) * len(self.runs)


def depth_grid(n: int) -> list[float]:
    """n evenly spaced depths from 0 to 1 (RULER and needle tests use 11: 0%, 10%, ... 100%)."""
    return [0.5] if n <= 1 else [round(i / (n - 1), 4) for i in range(n)]


def build_samples(grid: Grid, count: TokenCounter) -> list[TaskSample]:
    return [
        make_sample(get_task(task), length, depth, seed, count)
        for task, length, depth, seed in grid.cells()
    ]


def run_grid(
    grid: Grid,
    count: TokenCounter,
    backend_for: Callable[[PolicyRun], GenerationBackend],
    out_path: Path,
    model_name: str,
    on_progress: Callable[[int], None] | None = None,
    batch_size: int = 8,
) -> list[dict[str, object]]:
    """Generate every sample once, answer it under every policy run, append rows to out_path."""
    samples = build_samples(grid, count)
    rows: list[dict[str, object]] = []
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("a", encoding="utf-8") as fh:
        for run in grid.runs:
            backend = backend_for(run)
            for start in range(0, len(samples), batch_size):
                batch = samples[start : start + batch_size]
                for sample, gen in zip(batch, backend.generate(batch), strict=True):
                    row = {
                        "model": model_name,
                        "backend": backend.name,
                        "policy": run.policy,
                        "budget": run.budget,
                        "position_mode": run.position_mode,
                        "task": sample.task,
                        "length": sample.target_length,
                        "depth": sample.depth,
                        "seed": sample.seed,
                        "metric": sample.metric,
                        "score": string_match(gen.text, sample.references, sample.metric),
                        "prediction": gen.text,
                        "references": list(sample.references),
                        "prompt_tokens": sample.prompt_tokens,
                        "resident_kv_bytes": gen.resident_kv_bytes,
                        "kv_dtype": getattr(backend, "kv_dtype", None),
                    }
                    fh.write(json.dumps(row) + "\n")
                    rows.append(row)
                fh.flush()
                if on_progress:
                    on_progress(len(batch))
    return rows
