"""Progress: nothing for quick work in a pipe, plain lines for long work, a bar's API on both."""

from __future__ import annotations

import io
import time

from ctxlab.progress import progress


def test_quick_work_prints_nothing_in_a_pipe():
    out = io.StringIO()
    with progress("quick", total=3, stream=out) as bar:
        bar.advance(3)
    assert out.getvalue() == ""


def test_long_work_prints_plain_lines_with_counts_and_a_last_line():
    out = io.StringIO()
    with progress("loading", total=4, stream=out, delay=0.05, every=0.05) as bar:
        bar.advance(2)
        time.sleep(0.2)
        bar.describe("loading more")
        bar.advance(2)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("loading: 2/4 (")
    assert lines[-1].startswith("loading more: done (")
    assert all("\x1b" not in line for line in lines)  # plain text, no terminal codes


def test_a_spinner_without_total_says_it_is_working():
    out = io.StringIO()
    with progress("building", stream=out, delay=0.02, every=10):
        time.sleep(0.1)
    assert out.getvalue().splitlines() == [
        line for line in out.getvalue().splitlines() if line.startswith("building: ")
    ]
    assert "working" in out.getvalue() and "done" in out.getvalue()


def test_disabled_progress_is_silent_and_an_error_still_ends_the_ticker():
    out = io.StringIO()
    with progress("off", total=1, stream=out, enabled=False) as bar:
        bar.advance()
    assert out.getvalue() == ""
    try:
        with progress("fails", stream=out, delay=0.01, every=0.01):
            time.sleep(0.05)
            raise ValueError("boom")
    except ValueError:
        pass
    printed = out.getvalue()
    time.sleep(0.05)
    assert out.getvalue() == printed  # the ticker thread stopped with the work
