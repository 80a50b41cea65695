"""Progress for long work: a rich bar on a terminal, plain one-line updates elsewhere.

Every command that runs for more than a few seconds (loading a model, a long prefill, an
eval grid, a workshop demonstration) reports through `progress(...)`, so a user always sees
that something is happening and a log file still gets readable lines. Progress goes to
stderr, which keeps `--json` output on stdout clean. Nothing here imports torch.
"""

from __future__ import annotations

import sys
import threading
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
    """Plain lines for a pipe or a log: nothing for work shorter than `delay` seconds, then
    one line at once and one every `every` seconds (from a ticker thread, so a step that
    never advances still shows it is alive), and a last line when it ends."""

    def __init__(
        self, description: str, total: int | None, stream: TextIO, every: float, delay: float
    ):
        self.description, self.total, self.stream = description, total, stream
        self.every, self.delay = every, delay
        self.done = 0
        self.start = time.perf_counter()
        self.printed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()

    def _line(self, state: str | None = None) -> None:
        with self._lock:
            count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
            if state is None and not self.done and self.total is None:
                count = "working"
            elapsed = time.perf_counter() - self.start
            self.stream.write(f"{self.description}: {state or count} ({elapsed:.0f} s)\n")
            self.stream.flush()
            self.printed = True

    def _tick(self) -> None:
        wait = self.delay
        while not self._stop.wait(wait):
            self._line()
            wait = self.every

    def advance(self, n: int = 1) -> None:
        self.done += n

    def describe(self, description: str) -> None:
        self.description = description
        if self.printed:
            self._line()

    def close(self) -> None:
        self._stop.set()
        self._ticker.join()
        if self.printed:
            self._line("done")


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
    delay: float = 1.0,
) -> Iterator[Tracker]:
    """Report `total` steps of work (or an open-ended spinner when `total` is None).

    A terminal gets a transient rich bar (a spinner when there is no total); a pipe or a
    file gets plain lines once the work has run `delay` seconds: one then, one every
    `every` seconds, and a last one when it ends (work shorter than `delay` prints nothing).
    """
    out = stream if stream is not None else sys.stderr
    if not enabled:
        yield _Silent()
        return
    if not out.isatty():
        tracker = _PlainLines(description, total, out, every, delay)
        try:
            yield tracker
        finally:
            tracker.close()
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
