"""The README's commands run, so the README cannot go stale.

Every `$ ...` line in a fenced block of README.md is a command (a trailing backslash joins
the next line). Commands that start with `ctxlab` are run in order, in one temporary folder
(a later command may read what an earlier one wrote), with `ctxlab` meaning this checkout
under the current interpreter. A command must exit 0, or, when the README shows an
`error: ...` line right under it, exit 2 with exactly that line on stderr. Any other
command (make, python, curl) must be in SKIP with the reason it is not run here, so a new
README section is covered without touching this file, and a skipped command that left the
README fails the test instead of rotting in the list.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# command prefix -> why it is not run by this test
SKIP = {
    "make run": "installs into .venv and runs the whole workshop (minutes); tests/workshop run "
    "its demonstrations at --quick sizes",
    "make test": "the test suite itself",
    "ctxlab lab": "serves until Ctrl-C; tests/lab starts the server and drives it",
    "ctxlab serve": "serves until Ctrl-C; tests/serve start it and drive it with real clients",
    "ctxlab bench serve": "needs a running server; tests/bench run it against ctxlab serve",
    "ctxlab profile": "minutes of timed engine steps; tests/sim/test_calibrate_engine.py runs one",
    "ctxlab simulate --calibrate": "minutes of real-time replay; tests/sim covers both sides",
}


@dataclass(frozen=True)
class Example:
    line: int
    command: str
    error: str | None  # the `error: ...` line the README shows under it, if any


def examples(text: str) -> list[Example]:
    found: list[Example] = []
    in_block = False
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_block = not in_block
            i += 1
            continue
        if in_block and line.startswith("$ "):
            start = i
            command = line[2:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1].rstrip() + " " + lines[i].strip()
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            error = nxt if nxt.startswith("error:") else None
            found.append(Example(start + 1, command.strip(), error))
        i += 1
    return found


def _skip_reason(command: str) -> str | None:
    return next((why for prefix, why in SKIP.items() if command.startswith(prefix)), None)


def _shim(folder: Path) -> Path:
    """A `ctxlab` on PATH that runs this checkout with the current interpreter."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ctxlab"
    shim.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -c "from ctxlab.cli import main; main()" "$@"\n'
    )
    shim.chmod(0o755)
    return bin_dir


def test_the_parser_finds_commands_and_every_skip_entry_is_used():
    found = examples(README.read_text(encoding="utf-8"))
    commands = [e.command for e in found]
    assert any(c.startswith("ctxlab plan") for c in commands)
    assert any(e.error for e in found)
    for prefix in SKIP:
        assert any(c.startswith(prefix) for c in commands), f"SKIP entry {prefix!r} is unused"
    others = [c for c in commands if not c.startswith("ctxlab") and _skip_reason(c) is None]
    assert not others, f"README commands that are neither ctxlab nor skipped: {others}"


def test_parser_joins_continuations_and_reads_shown_errors():
    text = textwrap.dedent(
        """\
        ```
        $ ctxlab plan x \\
            --context 4096
        error: unknown architecture preset 'x'
        $ ctxlab plan --list
        ```
        $ ctxlab outside a block is prose
        """
    )
    assert examples(text) == [
        Example(2, "ctxlab plan x --context 4096", "error: unknown architecture preset 'x'"),
        Example(5, "ctxlab plan --list", None),
    ]


@pytest.mark.model
def test_every_readme_command_runs(tmp_path):
    bin_dir = _shim(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "100",
    }
    failures = []
    ran = 0
    for ex in examples(README.read_text(encoding="utf-8")):
        if _skip_reason(ex.command) is not None or not ex.command.startswith("ctxlab"):
            continue
        proc = subprocess.run(
            ["bash", "-c", ex.command],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        ran += 1
        where = f"README.md:{ex.line}: {shlex.quote(ex.command)}"
        if ex.error is None and proc.returncode != 0:
            failures.append(f"{where} exited {proc.returncode}: {proc.stderr[-500:]}")
        if ex.error is not None:
            shown = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
            if proc.returncode != 2 or shown != [ex.error]:
                failures.append(
                    f"{where}: README shows {ex.error!r}, got {shown} ({proc.returncode})"
                )
        if "Traceback" in proc.stderr:
            failures.append(f"{where} printed a traceback")
    assert ran >= 5
    assert not failures, "\n".join(failures)


def test_readme_stays_short_and_has_a_table_of_contents():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 350
    assert "## Contents" in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        if link != "docs/adding-a-policy.md":  # written by the policy work, merged separately
            assert (ROOT / link).is_file(), link
