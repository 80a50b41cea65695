"""The README's commands run, so the README cannot go stale.

Every `$ ...` line in a fenced block of README.md is a command (a trailing backslash joins
the next line). Commands that start with `ctxlab` are run in order, in one temporary folder
(a later command may read what an earlier one wrote). A command must exit 0, or, when the
README shows an `error: ...` line right under it, exit 2 with exactly that line on stderr.
Any other command (make, python, curl) must be in SKIP with the reason it is not run here,
so a new README section is covered without touching this file, and a skipped command that
left the README fails the test instead of rotting in the list.

A `ctxlab` command runs through `ctxlab.cli.main` in this process (a fresh interpreter costs
seconds each); the first command of each family in SHELL, and any command with shell syntax
(a pipe, a redirect, `&&`), runs in a real shell through the installed `ctxlab` script, so
the script a user types is run too (plan, simulate, lab, bench, rag and the tour have their
own fresh-process tests elsewhere).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.conftest import run_in_process

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


# command prefix -> the first README command with it runs in a real shell (see the docstring)
SHELL = ("ctxlab generate", "ctxlab eval", "ctxlab memory")


def _shim(folder: Path) -> Path:
    """A folder for PATH whose `ctxlab` is the installed script beside this interpreter, or,
    where there is none (a checkout run without `pip install -e`), this checkout under it."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ctxlab"
    installed = Path(sys.executable).parent / "ctxlab"
    if installed.is_file():
        shim.symlink_to(installed)
        return bin_dir
    shim.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -c "from ctxlab.cli import main; main()" "$@"\n'
    )
    shim.chmod(0o755)
    return bin_dir


def _words(command: str) -> list[str] | None:
    """The command's words as a shell splits them, or None when it needs a shell (a pipe, a
    redirect, `&&`, `;`, a variable or a glob)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", command)
    if any(set(w) <= set("();<>|&") for w in words) or any(c in unquoted for c in "$*?`~"):
        return None
    return words


def _in_process(monkeypatch, capsys, words: list[str]) -> tuple[int, str]:
    """`ctxlab WORDS` through `main()` here: (exit code, stderr); torch's threads and the
    RNG come back afterwards (`--threads`, `--seed`)."""
    import torch

    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    try:
        with monkeypatch.context() as mp:
            result = run_in_process(mp, capsys, *words[1:])
    except Exception:  # what a user's shell would show as a traceback
        return 1, capsys.readouterr().err + traceback.format_exc()
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)
    return result.code, result.err


def test_words_split_like_a_shell_and_shell_syntax_is_seen():
    assert _words('ctxlab generate "Name three." --chat') == [
        "ctxlab", "generate", "Name three.", "--chat",
    ]  # fmt: skip
    assert _words("ctxlab plan x  # a comment") == ["ctxlab", "plan", "x"]
    assert _words("ctxlab memory search 'Where?' --k 1") == [
        "ctxlab", "memory", "search", "Where?", "--k", "1",
    ]  # fmt: skip
    for shell in ("ctxlab plan --json | jq .", "ctxlab plan > x", "a && b", "echo $HOME"):
        assert _words(shell) is None, shell


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
def test_every_readme_command_runs(tmp_path, monkeypatch, capsys):
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
    monkeypatch.chdir(work)
    failures = []
    ran, shells = 0, []
    to_shell = set(SHELL)
    for ex in examples(README.read_text(encoding="utf-8")):
        if _skip_reason(ex.command) is not None or not ex.command.startswith("ctxlab"):
            continue
        words = _words(ex.command)
        first = next((p for p in to_shell if ex.command.startswith(p)), None)
        if words is None or first is not None:
            to_shell.discard(first)
            proc = subprocess.run(
                ["bash", "-c", ex.command],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            code, err = proc.returncode, proc.stderr
            shells.append(ex.command)
        else:
            code, err = _in_process(monkeypatch, capsys, words)
        ran += 1
        where = f"README.md:{ex.line}: {shlex.quote(ex.command)}"
        if ex.error is None and code != 0:
            failures.append(f"{where} exited {code}: {err[-500:]}")
        if ex.error is not None:
            shown = [ln for ln in err.splitlines() if ln.startswith("error:")]
            if code != 2 or shown != [ex.error]:
                failures.append(f"{where}: README shows {ex.error!r}, got {shown} ({code})")
        if "Traceback" in err:
            failures.append(f"{where} printed a traceback")
    assert ran >= 5
    assert not to_shell, f"no README command starts with {sorted(to_shell)} (SHELL is stale)"
    assert len(shells) >= 1
    assert not failures, "\n".join(failures)


def test_readme_stays_short_and_has_a_table_of_contents():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 350
    assert "## Contents" in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        if link != "docs/adding-a-policy.md":  # written by the policy work, merged separately
            assert (ROOT / link).is_file(), link
