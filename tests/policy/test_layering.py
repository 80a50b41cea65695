"""Policies are pure decisions: importing every policy module pulls in no engine, model or
transformers code, so at run time control can only flow down (engine -> policy)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import importlib, pkgutil, sys
import ctxlab.policy as p
for m in pkgutil.iter_modules(p.__path__):
    importlib.import_module(f"ctxlab.policy.{m.name}")
up = ("ctxlab.engine", "ctxlab.model", "ctxlab.hf", "transformers")
print(sorted(m for m in sys.modules if m.startswith(up)))
"""


def test_policies_import_nothing_that_executes():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
