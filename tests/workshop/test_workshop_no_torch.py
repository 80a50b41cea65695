"""The registry and the config need no model stack: importing the registry and loading the
default config (and its quick sizes) leave torch unimported, as the registry's docstring says."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import ctxlab.workshop.registry
from ctxlab.workshop.config_file import load_config
load_config()
load_config(quick=True)
bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print("torch modules:", bad[:5])
sys.exit(1 if bad else 0)
"""


def test_registry_and_default_config_do_not_import_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
