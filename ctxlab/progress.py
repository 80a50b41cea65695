"""Progress for long work: a rich bar on a terminal, plain one-line updates elsewhere.

Every command that runs for more than a few seconds (loading a model, a long prefill, an
eval grid, a workshop demonstration) reports through `progress(...)`, so a user always sees
that something is happening and a log file still gets readable lines. Progress goes to
stderr, which keeps `--json` output on stdout clean. Nothing here imports torch.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Tracker:
    """What a piece of work calls as it goes; the display behind it is chosen once."""

    def advance(self, n: int = 1) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self, description: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class _Silent(Tracker):
    def advance(self, n: int = 1) -> None:
        pass

    def describe(self, description: str) -> None:
        pass


class _PlainLines(Tracker):
    """One line per update, at most every `every` seconds (and always the last one)."""

    def __init__(self, description: str, total: int | None, stream: TextIO, every: float):
        self.description, self.total, self.stream, self.every = description, total, stream, every
        self.done = 0
        self.start = time.perf_counter()
        self.last = 0.0
        self._line(force=True)

    def _line(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last < self.every:
            return
        self.last = now
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        elapsed = now - self.start
        self.stream.write(f"{self.description}: {count} ({elapsed:.0f} s)\n")
        self.stream.flush()

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._line(force=self.total is not None and self.done >= self.total)

    def describe(self, description: str) -> None:
        self.description = description
        self._line(force=True)


class _RichBar(Tracker):
    def __init__(self, bar, task_id) -> None:
        self.bar, self.task_id = bar, task_id

    def advance(self, n: int = 1) -> None:
        self.bar.advance(self.task_id, n)

    def describe(self, description: str) -> None:
        self.bar.update(self.task_id, description=description)


@contextmanager
def progress(
    description: str,
    total: int | None = None,
    *,
    enabled: bool = True,
    stream: TextIO | None = None,
    every: float = 5.0,
) -> Iterator[Tracker]:
    """Report `total` steps of work (or an open-ended spinner when `total` is None).

    A terminal gets a transient rich bar (a spinner when there is no total); a pipe or a
    file gets a plain line at the start, every `every` seconds and at the end.
    """
    out = stream if stream is not None else sys.stderr
    if not enabled:
        yield _Silent()
        return
    if not out.isatty():
        tracker = _PlainLines(description, total, out, every)
        yield tracker
        if tracker.total is None or tracker.done < tracker.total:
            tracker.stream.write(
                f"{tracker.description}: done ({time.perf_counter() - tracker.start:.0f} s)\n"
            )
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        [SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()]
        if total is None
        else [
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        ]
    )
    with Progress(*columns, console=Console(file=out), transient=True) as bar:
        yield _RichBar(bar, bar.add_task(description, total=total))
