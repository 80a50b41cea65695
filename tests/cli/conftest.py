"""Helpers for driving `ctxlab` as a user does: `main()` in-process, or a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def run_in_process(monkeypatch, capsys, *args: str) -> Result:
    """`ctxlab ARGS` through `ctxlab.cli.main` in this process (argv and COLUMNS patched)."""
    from ctxlab.cli import main

    monkeypatch.setattr(sys, "argv", ["ctxlab", *args])
    monkeypatch.setenv("COLUMNS", "160")
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return Result(code, out, err)


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run `ctxlab ARGS` in this process: `cli("plan", "--list")`."""
    return lambda *args: run_in_process(monkeypatch, capsys, *args)


def run_fresh(*args: str, cwd: str | None = None, env: dict | None = None) -> Result:
    """`ctxlab ARGS` in a new interpreter (what a user's shell runs)."""
    proc = subprocess.run(
        [sys.executable, "-c", "from ctxlab.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "160", **(env or {})},
        timeout=300,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)
